package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pulse-agent/pulse/sandbox"
)

// runDoctorNetwork is `pulse doctor network`: the egress bypass suite on
// each local backend, and what held.
func runDoctorNetwork(ctx context.Context, env *cliEnv, args []string) int {
	fs := newFlagSet(env, "doctor network")
	backendName := fs.String("backend", "auto", "run the suite on this backend only: namespace or docker")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if code, done := parseNoArgs(env, fs, args); done {
		return code
	}
	report, err := sandbox.DiagnoseNetwork(ctx, sandbox.WithBackendName(*backendName))
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse doctor network: %v\n", err)
		return exitFailure
	}
	code := exitOK
	for _, d := range report {
		if d.Reason == "" && !d.Held() {
			code = exitFailure
		}
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(report)
		return code
	}
	w := env.stdout
	for _, d := range report {
		if d.Reason != "" {
			fmt.Fprintf(w, "%s: not tried: %s\n\n", d.Backend, d.Reason)
			continue
		}
		held, failed, skipped := 0, 0, 0
		for _, r := range d.Results {
			switch {
			case r.Skipped != "":
				skipped++
			case r.Held:
				held++
			default:
				failed++
			}
		}
		verdict := "HOLDS"
		if failed > 0 {
			verdict = "BYPASSED"
		}
		fmt.Fprintf(w, "%s: network allowlist %s — %s: %d held, %d failed, %d skipped\n", d.Backend, d.Level, verdict, held, failed, skipped)
		for _, r := range d.Results {
			switch {
			case r.Skipped != "":
				fmt.Fprintf(w, "  skip    %s (%s)\n", r.Name, r.Skipped)
			case r.Held:
				fmt.Fprintf(w, "  held    %s\n", r.Name)
			default:
				fmt.Fprintf(w, "  FAILED  %s: %s\n", r.Name, r.Detail)
			}
		}
		fmt.Fprintln(w)
	}
	return code
}
