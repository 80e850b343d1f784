package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
	"github.com/pulse-agent/pulse/secrets"
)

func init() {
	register(command{
		name:    "doctor",
		summary: "show each backend, whether it is available here, and what it enforces",
		run:     runDoctor,
	})
}

func runDoctor(ctx context.Context, env *cliEnv, args []string) int {
	fs := flag.NewFlagSet("pulse doctor", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	unsafeHost := fs.Bool("unsafe-host", false, "report the host backend as selectable")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var opts []sandbox.Option
	if *unsafeHost {
		opts = append(opts, sandbox.WithUnsafeHostExecution())
	}
	report, err := sandbox.Diagnose(ctx, opts...)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse doctor: %v\n", err)
		return exitFailure
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(report)
		return exitOK
	}
	printDoctor(env.stdout, report)
	return exitOK
}

func printDoctor(w io.Writer, report []sandbox.BackendStatus) {
	chosen := ""
	for _, st := range report {
		if st.Selectable && chosen == "" {
			chosen = st.Name
		}
	}
	for _, st := range report {
		mark := "unavailable"
		switch {
		case st.Name == chosen:
			mark = "AVAILABLE — chosen by default"
		case st.Selectable:
			mark = "available"
		case st.Available:
			mark = "available, not chosen"
		}
		if st.Name == "remote" && !st.Available && st.Capabilities.Isolation == "" {
			fmt.Fprintf(w, "remote: not configured (set PULSE_REMOTE_URL and PULSE_REMOTE_TOKEN to use a pulse-server)\n\n")
			continue
		}
		fmt.Fprintf(w, "%s: %s\n", st.Name, mark)
		if st.Reason != "" {
			fmt.Fprintf(w, "  why: %s\n", strings.ReplaceAll(st.Reason, "\n", "\n       "))
		}
		c := st.Capabilities
		fmt.Fprintf(w, "  isolation: %s, writes captured: %v\n", c.Isolation, c.CapturesWrites)
		fmt.Fprintf(w, "  network:  deny-all %-11s allowlist %-11s allow-all %s\n",
			c.NetworkLevel(policy.NetworkDenyAll), c.NetworkLevel(policy.NetworkAllowlist), c.NetworkLevel(policy.NetworkAllowAll))
		fmt.Fprintf(w, "  secrets:  deny-all %-11s allowlist %-11s allow-all %s\n",
			c.SecretLevel(secrets.DenyAll), c.SecretLevel(secrets.Allowlist), c.SecretLevel(secrets.AllowAll))
		if len(c.Limits) > 0 {
			keys := make([]string, 0, len(c.Limits))
			for k := range c.Limits {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			parts := make([]string, 0, len(keys))
			for _, k := range keys {
				parts = append(parts, k+" "+string(c.Limits[k]))
			}
			fmt.Fprintf(w, "  limits:   %s\n", strings.Join(parts, ", "))
		}
		for _, n := range c.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
		fmt.Fprintln(w)
	}
	if chosen == "" {
		fmt.Fprintln(w, "No backend would be chosen: `pulse exec` refuses to run. Pass --unsafe-host to run unisolated on this machine.")
	}
}
