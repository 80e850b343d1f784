package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pulse-agent/pulse/backend/docker"
)

func init() {
	register(command{
		name:    "gc",
		summary: "remove the Docker sandbox containers that processes which ended left behind, and expired warm ones",
		usage:   []string{"pulse gc [--json]"},
		help: `Removes every Docker sandbox container on this host's engine whose owning pulse
process has ended (a crash, a kill -9), with its volumes: what Reconcile does
when a sandbox opens, on demand. It also removes the warm containers pulse
exec leaves for the next command (PULSE_KEEP_WARM) whose idle lifetime is
over, or whose holder died while it held them. Containers of live
processes, warm ones in use or still fresh, and those of other hosts
sharing the engine, are left alone. --json prints {removed: [ID...]}.
Exit code 1 when the engine does not answer or a removal fails.`,
		run: runGC,
	})
}

func runGC(ctx context.Context, env *cliEnv, args []string) int {
	fs := newFlagSet(env, "gc")
	asJSON := fs.Bool("json", false, "print {removed: [ID...]} as JSON")
	if code, done := parseNoArgs(env, fs, args); done {
		return code
	}
	var opts []docker.Option
	if h := env.getenv("DOCKER_HOST"); h != "" {
		opts = append(opts, docker.WithDockerHost(h))
	}
	b, err := docker.New(opts...)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse gc: %v\n", err)
		return exitFailure
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	removed, err := b.Collect(ctx)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse gc: %v\n", err)
		return exitFailure
	}
	if removed == nil {
		removed = []string{}
	}
	if *asJSON {
		writeJSON(env.stdout, map[string]any{"removed": removed})
		return exitOK
	}
	for _, id := range removed {
		fmt.Fprintf(env.stdout, "removed %.12s\n", id)
	}
	fmt.Fprintf(env.stdout, "%d leftover sandbox container(s) removed\n", len(removed))
	return exitOK
}
