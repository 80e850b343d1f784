package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pulse-agent/pulse/caches"
)

func init() {
	register(command{
		name:    "cache",
		summary: "list or prune the persistent caches (module and build caches) commands share",
		usage: []string{
			"pulse cache list [--json]",
			"pulse cache prune NAME...|--all [--json]",
		},
		help: `Caches are named directories a policy's caches: (or sandbox.WithCache)
mounts read-write into every command: GOMODCACHE, GOCACHE, npm, pip. They are
shared by every sandbox of the user, live under $` + caches.DirEnv + ` (default: the
user cache directory's pulse/caches), and are never reviewed: the audit log
records each command that mounts one. list shows each cache's size, file count
and last change; prune removes the named caches (or --all) with their
contents; the next command that declares one starts it empty.
Exit code 1: an unknown cache name, or a directory that cannot be read or removed.
--json: list prints an array of {name, dir, bytes, files, modified}; prune
{pruned: [names]}; a failure {error, exit_code}.`,
		subcommands: []string{"list", "prune"},
		run:         runCache,
	})
}

// runCache implements `pulse cache list|prune`.
func runCache(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 {
		return usageError(env, newFlagSet(env, "cache"), "no subcommand given")
	}
	sub := args[0]
	if isHelp(sub) {
		return commandHelp(env, "cache")
	}
	if sub != "list" && sub != "prune" {
		return usageError(env, newFlagSet(env, "cache"), fmt.Sprintf("unknown subcommand %q", sub))
	}
	fset := newFlagSet(env, "cache "+sub)
	asJSON := fset.Bool("json", false, "print JSON")
	var all *bool
	if sub == "prune" {
		all = fset.Bool("all", false, "prune every cache")
	}
	pos, code, done := parseInterleaved(env, fset, args[1:])
	if done {
		return code
	}
	root, err := caches.Root(env.getenv)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse cache %s: %v\n", sub, err)
		return exitFailure
	}
	if sub == "list" {
		if len(pos) != 0 {
			return usageError(env, fset, fmt.Sprintf("unexpected argument %q", pos[0]))
		}
		list, err := caches.List(root)
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse cache list: %v\n", err)
			return exitFailure
		}
		if *asJSON {
			if list == nil {
				list = []caches.Info{}
			}
			writeJSON(env.stdout, list)
			return exitOK
		}
		if len(list) == 0 {
			fmt.Fprintf(env.stdout, "no caches in %s\n", root)
			return exitOK
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSIZE\tFILES\tMODIFIED\tDIR")
		for _, in := range list {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", in.Name, humanBytes(in.Bytes), in.Files, in.Modified.Local().Format(time.DateTime), in.Dir)
		}
		tw.Flush()
		return exitOK
	}
	switch {
	case *all && len(pos) != 0:
		return usageError(env, fset, "wants cache NAMEs or --all, not both")
	case !*all && len(pos) == 0:
		return usageError(env, fset, "wants cache NAMEs or --all")
	}
	names := pos
	if *all {
		list, err := caches.List(root)
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse cache prune: %v\n", err)
			return exitFailure
		}
		for _, in := range list {
			names = append(names, in.Name)
		}
	}
	pruned := []string{}
	for _, n := range names {
		if err := caches.Prune(root, n); err != nil {
			if errors.Is(err, caches.ErrNotFound) {
				err = fmt.Errorf("no cache %q in %s (pulse cache list)", n, root)
			}
			fmt.Fprintf(env.stderr, "pulse cache prune: %v\n", err)
			if *asJSON && len(pruned) > 0 {
				fmt.Fprintf(env.stderr, "pulse cache prune: pruned before the failure: %v\n", pruned)
			}
			return exitFailure
		}
		pruned = append(pruned, n)
		if !*asJSON {
			fmt.Fprintf(env.stdout, "pruned %s\n", n)
		}
	}
	if *asJSON {
		writeJSON(env.stdout, map[string]any{"pruned": pruned})
	} else if len(pruned) == 0 {
		fmt.Fprintln(env.stdout, "no caches to prune")
	}
	return exitOK
}

// humanBytes prints n in binary units, as the policy file writes sizes.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
