package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
	"github.com/pulse-agent/pulse/secrets"
)

func init() {
	register(command{
		name:    "doctor",
		summary: "show each backend, whether it is available here, and what it enforces",
		usage:   []string{"pulse doctor [--policy FILE] [--unsafe-host[=RULES]] [--json]", "pulse doctor network [--backend NAME] [--json]", "pulse doctor --attack [--backend NAME] [--json]"},
		help: `For each backend in the order 'pulse exec --backend auto' tries them: whether it
is available and why not, its isolation, the level (strong, best-effort,
unsupported) at which it enforces each network and secret mode and each limit,
and what it would do with a command under the policy (--policy FILE, else the
built-in one): the effective modes and limits and whether it would refuse.
For the host backend it lists what the host enforces and what it does not:
a policy asking for what it does not is refused unless --unsafe-host names
that rule (network, secrets, reads, limits), as pulse exec does.
--json prints an array of {name, available, reason, selectable, capabilities,
policy: {network, network_level, secrets, secrets_level, limits, refused,
needs_unsafe}}.

'pulse doctor network' (or 'pulse doctor --attack') runs the egress bypass suite on the namespace and
Docker backends: allowed requests through the proxy, and every known way
around the network allowlist (relayed CONNECT, SNI and Host header
mismatches, direct TCP, UDP and DNS, IPv6, rebinding, the secret's
placeholder); it prints what held and exits 1 if anything got through.
Every server it uses is on 127.0.0.1.`,
		run: runDoctor,
	})
}

func runDoctor(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) > 0 && args[0] == "network" {
		return runDoctorNetwork(ctx, env, args[1:]) // doctor_network.go
	}
	// --attack is the other spelling of `doctor network`, anywhere among
	// the flags.
	for i, a := range args {
		if a == "--attack" || a == "-attack" {
			return runDoctorNetwork(ctx, env, slices.Delete(slices.Clone(args), i, i+1))
		}
	}
	fs := newFlagSet(env, "doctor")
	unsafeHost := addUnsafeHostFlag(fs, "report the host backend as selectable, accepting the rules named (--unsafe-host=network,secrets) as pulse exec would")
	policyFile := fs.String("policy", "", "show what each backend would do under this policy file (default: the built-in policy)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if code, done := parseNoArgs(env, fs, args); done {
		return code
	}
	var opts []sandbox.Option
	if unsafeHost.on {
		opts = append(opts, sandbox.WithUnsafeHostExecution(unsafeHost.accept...))
	}
	if *policyFile != "" {
		pol, err := policy.Load(*policyFile)
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse doctor: %v\n", err)
			return exitUsage
		}
		opts = append(opts, sandbox.WithPolicy(pol))
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
	printDoctor(env.stdout, report, *policyFile)
	return exitOK
}

func printDoctor(w io.Writer, report []sandbox.BackendStatus, policyFile string) {
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
		fmt.Fprintf(w, "  isolation: %s, writes captured: %v, read-denied paths hidden: %v\n", c.Isolation, c.CapturesWrites, c.HidesPaths)
		fmt.Fprintf(w, "  network:  deny-all %-11s allowlist %-11s allow-all %s\n",
			c.NetworkLevel(policy.NetworkDenyAll), c.NetworkLevel(policy.NetworkAllowlist), c.NetworkLevel(policy.NetworkAllowAll))
		fmt.Fprintf(w, "  secrets:  deny-all %-11s allowlist %-11s allow-all %s\n",
			c.SecretLevel(secrets.DenyAll), c.SecretLevel(secrets.Allowlist), c.SecretLevel(secrets.AllowAll))
		if len(c.Limits) > 0 {
			keys := slices.Sorted(maps.Keys(c.Limits))
			parts := make([]string, 0, len(keys))
			for _, k := range keys {
				parts = append(parts, string(k)+" "+string(c.Limits[k]))
			}
			fmt.Fprintf(w, "  limits:   %s\n", strings.Join(parts, ", "))
		}
		for _, n := range c.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
		if c.Isolation == backend.IsolationHostUnsafe {
			printHostEnforcement(w, c)
		}
		printFit(w, st.Policy, policyFile)
		fmt.Fprintln(w)
	}
	if chosen == "" {
		fmt.Fprintln(w, "No backend would be chosen: `pulse exec` refuses to run. Pass --unsafe-host to run unisolated on this machine.")
	}
}

// printHostEnforcement says what the unsafe host backend enforces, at
// which level, and what it does not, grouped by the --unsafe-host rule
// that accepts it going unenforced: without that rule a policy asking for
// it is refused.
func printHostEnforcement(w io.Writer, c backend.Capabilities) {
	var strong, best []string
	none := map[sandbox.UnsafeRule][]string{}
	for _, m := range []policy.NetworkMode{policy.NetworkAllowAll, policy.NetworkDenyAll, policy.NetworkAllowlist} {
		if c.NetworkLevel(m) == policy.Strong {
			strong = append(strong, "network "+string(m))
		} else {
			none[sandbox.UnsafeNetwork] = append(none[sandbox.UnsafeNetwork], "network "+string(m))
		}
	}
	envOnly := false
	for _, m := range []secrets.Mode{secrets.AllowAll, secrets.DenyAll, secrets.Allowlist} {
		if c.SecretLevel(m) == policy.Strong {
			strong = append(strong, "secrets "+string(m))
			continue
		}
		none[sandbox.UnsafeSecrets] = append(none[sandbox.UnsafeSecrets], "secrets "+string(m))
		envOnly = envOnly || c.SecretLevel(m) == policy.BestEffort
	}
	if envOnly {
		l := none[sandbox.UnsafeSecrets]
		l[len(l)-1] += " (only the environment is withheld; files on disk stay readable)"
	}
	for _, k := range slices.Sorted(maps.Keys(c.Limits)) {
		switch c.Limits[k] {
		case policy.Strong:
			strong = append(strong, "limit "+string(k))
		case policy.BestEffort: // accepted on every backend, audited
			best = append(best, "limit "+string(k))
		default:
			none[sandbox.UnsafeLimits] = append(none[sandbox.UnsafeLimits], "limit "+string(k))
		}
	}
	if !c.HidesPaths {
		none[sandbox.UnsafeReads] = append(none[sandbox.UnsafeReads], "read-deny rules (the command can read every file)")
	}
	fmt.Fprintf(w, "  the host enforces: %s\n", strings.Join(strong, ", "))
	if len(best) > 0 {
		fmt.Fprintf(w, "  at best effort: %s\n", strings.Join(best, ", "))
	}
	fmt.Fprintln(w, "  it does not enforce (a policy asking for it is refused, unless accepted by name):")
	for _, r := range sandbox.UnsafeRules() {
		if len(none[r]) > 0 {
			fmt.Fprintf(w, "    %s: accepted by --unsafe-host=%s\n", strings.Join(none[r], ", "), r)
		}
	}
	if !c.CapturesWrites {
		fmt.Fprintln(w, "    capturing writes: they land in the workspace itself, with nothing to review or undo")
	}
}

// printFit says what the backend would do with a command under the policy.
func printFit(w io.Writer, f *sandbox.PolicyFit, policyFile string) {
	if f == nil {
		return
	}
	which := "the built-in policy"
	if policyFile != "" {
		which = policyFile
	}
	fmt.Fprintf(w, "  under %s:\n", which)
	fmt.Fprintf(w, "    network %-10s %s\n", f.Network, f.NetworkLevel)
	if f.NetworkWhy != "" {
		fmt.Fprintf(w, "      because %s\n", f.NetworkWhy)
	}
	fmt.Fprintf(w, "    secrets %-10s %s\n", f.Secrets, f.SecretsLevel)
	for _, n := range slices.Sorted(maps.Keys(f.Limits)) {
		l := f.Limits[n]
		v := strconv.FormatFloat(l.Value, 'f', -1, 64)
		if l.Unit == "ms" {
			v = (time.Duration(l.Value) * time.Millisecond).String()
		}
		fmt.Fprintf(w, "    %-18s %-12s %s\n", n, v, l.Level)
	}
	if f.Refused != "" {
		fmt.Fprintf(w, "    a command would be REFUSED: %s\n", f.Refused)
	} else {
		fmt.Fprintln(w, "    a command would run")
	}
}
