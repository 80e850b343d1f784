package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

func init() {
	register(command{
		name:    "cow",
		summary: "review staged changes: list, diff, commit, discard or reject parts of a transaction, undo a commit",
		usage: []string{
			"pulse cow list [--json] [--workspace DIR]",
			"pulse cow diff ID [--json] [--workspace DIR]",
			"pulse cow commit ID [--json] [--workspace DIR]",
			"pulse cow discard ID [--json] [--workspace DIR]",
			"pulse cow reject ID PATH... [--json] [--workspace DIR]",
			"pulse cow undo [--json] [--workspace DIR]",
		},
		help: `Exit code 1: a conflict (the file changed since it was staged; nothing is
overwritten), an unknown id, or no staged state in the workspace.
--json: list prints an array of {id, description, state, created, committed,
changes, bytes}; diff {id, changes, diff}; commit {id, committed}; discard
{id, discarded}; a failure {error, exit_code} and, for a conflict,
conflict: {path, reason}.`,
		subcommands: []string{"list", "diff", "commit", "discard", "reject", "undo"},
		run:         runCow,
	})
}

// runCow implements `pulse cow SUBCOMMAND`. Exit codes: 0 ok, 1 conflict
// or other failure, 2 usage.
func runCow(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 {
		return usageError(env, newFlagSet(env, "cow"), "no subcommand given")
	}
	sub := args[0]
	if isHelp(sub) {
		return commandHelp(env, "cow")
	}
	wantID := map[string]bool{"diff": true, "commit": true, "discard": true}
	if !wantID[sub] && sub != "list" && sub != "undo" && sub != "reject" {
		return usageError(env, newFlagSet(env, "cow"), fmt.Sprintf("unknown subcommand %q", sub))
	}
	fset := newFlagSet(env, "cow "+sub)
	asJSON := fset.Bool("json", false, "print JSON")
	workspace := fset.String("workspace", "", "workspace directory (default: the current directory)")
	// Flags may come before or after the id.
	pos, code, done := parseInterleaved(env, fset, args[1:])
	if done {
		return code
	}
	if sub == "reject" && len(pos) < 2 {
		return usageError(env, fset, "wants a transaction ID and the PATHs to reject")
	}
	if wantID[sub] && len(pos) != 1 {
		return usageError(env, fset, "wants one transaction ID")
	}
	if !wantID[sub] && sub != "reject" && len(pos) != 0 {
		return usageError(env, fset, fmt.Sprintf("unexpected argument %q", pos[0]))
	}
	ws := *workspace
	if ws == "" {
		wd, err := os.Getwd()
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse cow: %v\n", err)
			return exitFailure
		}
		ws = wd
	}
	// A review command looks; it does not make state where there is
	// none (cowfs.Open would create .pulse/cow in any directory named).
	if _, err := os.Stat(filepath.Join(ws, cowfs.StateDir)); errors.Is(err, fs.ErrNotExist) {
		if sub == "list" {
			if *asJSON {
				fmt.Fprintln(env.stdout, "[]")
			} else {
				fmt.Fprintf(env.stderr, "pulse cow: no transactions in %s (nothing was staged there yet)\n", ws)
			}
			return exitOK
		}
		fmt.Fprintf(env.stderr, "pulse cow: %s has no staged transactions (no %s); is --workspace right?\n", ws, cowfs.StateDir)
		return exitFailure
	}
	c := cowCLI{env: env, json: *asJSON}
	if sub == "list" || sub == "diff" {
		// Looking changes nothing and is not audited.
		f, err := cowfs.Open(ws)
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse cow: %v\n", err)
			return exitFailure
		}
		defer f.Close()
		if rerr := f.RecoveryErr(); rerr != nil {
			fmt.Fprintf(env.stderr, "pulse cow: warning: %v\n", rerr)
		}
		if sub == "list" {
			return c.list(f)
		}
		tx, err := f.Tx(pos[0])
		if err != nil {
			return c.fail(err)
		}
		d, err := tx.Diff()
		if err != nil {
			return c.fail(err)
		}
		changes := tx.Changes()
		hostRun := runsOnHost(changes)
		out := map[string]any{"id": tx.ID(), "changes": changes, "diff": d}
		if len(hostRun) > 0 {
			out["runs_on_host"] = hostRun
		}
		return c.print(out, hostRunWarning(hostRun)+d)
	}
	// Decisions go through the facade's one audited review path.
	r, err := sandbox.OpenReview(ctx, ws, sandbox.ReviewVia(sandbox.ViaCLI), reviewEnv(env))
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse cow: %v\n", err)
		return exitFailure
	}
	defer r.Close()
	if rerr := r.FS().RecoveryErr(); rerr != nil {
		fmt.Fprintf(env.stderr, "pulse cow: warning: %v\n", rerr)
	}
	switch sub {
	case "undo":
		info, err := r.Undo(ctx)
		if err != nil {
			return c.fail(err)
		}
		return c.print(info, fmt.Sprintf("undid %s (%s)\n", info.ID, info.Description))
	case "commit":
		prog := newProgress(env)
		prog.set("committing " + pos[0])
		paths, err := r.Commit(ctx, pos[0])
		prog.close()
		if err != nil {
			return c.fail(err)
		}
		if paths == nil {
			paths = []string{}
		}
		return c.print(map[string]any{"id": pos[0], "committed": paths},
			fmt.Sprintf("committed %s: %d change(s)\n%s", pos[0], len(paths), lines(paths)))
	case "reject":
		gone, err := r.Reject(ctx, pos[0], pos[1:])
		if err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"id": pos[0], "rejected": gone},
			fmt.Sprintf("rejected from %s: %d change(s)\n%s", pos[0], len(gone), lines(gone)))
	default: // discard
		if err := r.Discard(ctx, pos[0]); err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"id": pos[0], "discarded": true}, "discarded "+pos[0]+"\n")
	}
}

// reviewEnv makes the review find the audit key through the command's
// environment.
func reviewEnv(env *cliEnv) sandbox.ReviewOption { return sandbox.ReviewGetenv(env.getenv) }

type cowCLI struct {
	env  *cliEnv
	json bool
}

func lines(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	return strings.Join(ss, "\n") + "\n"
}

func (c cowCLI) print(v any, text string) int {
	if c.json {
		enc := json.NewEncoder(c.env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			fmt.Fprintf(c.env.stderr, "pulse cow: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	io.WriteString(c.env.stdout, text)
	return exitOK
}

// fail reports err; with --json the error (and, for a conflict, its path
// and reason) is printed as JSON on stdout as well.
func (c cowCLI) fail(err error) int {
	fmt.Fprintf(c.env.stderr, "pulse cow: %v\n", err)
	if c.json {
		out := map[string]any{"error": err.Error()}
		var ce *cowfs.ConflictError
		if errors.As(err, &ce) {
			out["conflict"] = ce
		}
		json.NewEncoder(c.env.stdout).Encode(out)
	}
	return exitFailure
}

func (c cowCLI) list(f *cowfs.FS) int {
	infos, err := f.List()
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		if infos == nil {
			infos = []cowfs.TxInfo{}
		}
		return c.print(infos, "")
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCHANGES\tBYTES\tCREATED\tDESCRIPTION")
	for _, i := range infos {
		desc := i.Description
		if i.Reason != "" {
			desc += " [" + i.Reason + "]"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", i.ID, i.State, i.Changes, i.Bytes,
			i.Created.Local().Format(time.DateTime), desc)
	}
	tw.Flush()
	return exitOK
}

// runsOnHost lists the changes git on the host would take as instructions
// (hooks, config; see policy.RunsOnHost). Directories made only to hold
// another path are left out: their contents are listed themselves.
func runsOnHost(changes []cowfs.Change) []string {
	var out []string
	for _, ch := range changes {
		if !ch.Implicit && policy.RunsOnHost(ch.Path) {
			out = append(out, ch.Path)
		}
	}
	return out
}

// hostRunWarning is the banner `pulse cow diff` and `pulse exec` print
// above a diff that changes what git runs on the host, so that a person
// reads those paths before committing ("" when there are none).
func hostRunWarning(paths []string) string {
	if len(paths) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("WARNING: this transaction changes what git runs on the host: the next git command here\n" +
		"would run what the sandboxed command wrote. Auto-commit never applies these; read them first.\n")
	for _, p := range paths {
		fmt.Fprintf(&b, "  %s  (runs on the host)\n", p)
	}
	b.WriteString("\n")
	return b.String()
}
