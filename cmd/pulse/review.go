package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/review"
	"github.com/pulse-agent/pulse/sandbox"
)

func init() {
	register(command{
		name:    "review",
		summary: "serve a local page to review, commit and discard staged changes",
		usage:   []string{"pulse review [--workspace DIR] [--listen 127.0.0.1:PORT]"},
		help: `Serves the review page of a workspace on a loopback address and prints its
URL, token included, on standard output. Open it in a browser: it shows the
pending transactions with their diffs, lets you commit (all files, or the
ticked ones), discard and undo one, commit the whole pending stack (or its
ticked files) as one commit, squash it or discard it, and shows the audit
timeline. Every decision
is recorded in the workspace's audit log with your user name and the page's
session. Stop it with Ctrl-C.`,
		run: runReview,
	})
}

// reviewReady, when set (tests), is told the URL once the page serves.
var reviewReady func(url string)

func runReview(ctx context.Context, env *cliEnv, args []string) int {
	fset := newFlagSet(env, "review")
	workspace := fset.String("workspace", "", "workspace directory (default: the current directory)")
	listen := fset.String("listen", "127.0.0.1:0", "loopback address to serve on (port 0: any free one)")
	if code, done := parseFlags(env, fset, args); done {
		return code
	}
	if fset.NArg() != 0 {
		return usageError(env, fset, fmt.Sprintf("unexpected argument %q", fset.Arg(0)))
	}
	ws := *workspace
	if ws == "" {
		wd, err := os.Getwd()
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
			return exitFailure
		}
		ws = wd
	}
	if fi, err := os.Stat(ws); err != nil || !fi.IsDir() {
		fmt.Fprintf(env.stderr, "pulse review: %s is not a directory\n", ws)
		return exitFailure
	}
	if _, err := os.Stat(filepath.Join(ws, cowfs.StateDir)); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(env.stderr, "pulse review: note: nothing was staged in %s yet; the page updates when something is\n", ws)
	}
	host, _, err := net.SplitHostPort(*listen)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintf(env.stderr, "pulse review: --listen %q: want a loopback IP and port (127.0.0.1:PORT or [::1]:PORT); the page can commit to the workspace and is never served beyond this machine\n", *listen)
		return exitUsage
	}
	key, err := audit.LoadKey(env.getenv)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
		return exitFailure
	}
	token, err := review.NewToken()
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
		return exitInternal
	}
	r, done, err := openReview(ctx, env, ws, review.SessionID(token), key)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
		return exitFailure
	}
	defer done()
	srv, err := review.New(review.Config{Review: r, Token: token, AuditKey: key})
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
		return exitFailure
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
		return exitFailure
	}
	url := review.URL(ln, token)
	fmt.Fprintln(env.stdout, url)
	fmt.Fprintf(env.stderr, "pulse review: serving %s; open the URL above (it carries the access token). Ctrl-C stops.\n", ws)
	if reviewReady != nil {
		reviewReady(url)
	}
	if err := srv.Serve(ctx, ln); err != nil {
		fmt.Fprintf(env.stderr, "pulse review: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// openReview opens the review path of workspace ws. In the daemon it is
// that of the sandbox held for the workspace (opened, as a `pulse exec`
// without flags would open it, when none is), so the page, MCP sessions
// and commands of the workspace write through one copy-on-write store
// and one audit writer, and the page sees what they stage at its next
// poll. Where no sandbox can be opened (no backend here), and outside
// the daemon, it opens the staged state and audit log on its own.
func openReview(ctx context.Context, env *cliEnv, ws, session string, key *audit.Key) (*sandbox.Review, func(), error) {
	if sb, release := workspaceSandbox(ctx, env, ws); sb != nil {
		return sb.ReviewAs(sandbox.ViaReviewPage, session), release, nil
	}
	r, err := sandbox.OpenReview(ctx, ws, sandbox.ReviewVia(sandbox.ViaReviewPage), sandbox.ReviewSession(session),
		sandbox.ReviewAuditKey(key))
	if err != nil {
		return nil, nil, err
	}
	return r, func() { _ = r.Close() }, nil
}

// workspaceSandbox returns, in the daemon, the sandbox held for workspace
// ws: the one used last, or one opened as a `pulse exec` without flags
// would open it (so that the next such command finds it held). nil
// outside the daemon, and where no sandbox can be opened (no backend
// here): the caller opens the staged state on its own.
func workspaceSandbox(ctx context.Context, env *cliEnv, ws string) (*sandbox.Sandbox, func()) {
	if env.hold == nil {
		return nil, nil
	}
	sb, release := env.hold.lookup(workspaceID(ws))
	if sb == nil {
		fs := flag.NewFlagSet("exec", flag.ContinueOnError)
		sf := addSandboxFlags(fs)
		opts, err := sf.options(env.getenv, func(string) {})
		if err == nil {
			opts, err = withKeepWarm(env.getenv, opts)
		}
		if err != nil {
			return nil, nil
		}
		if sb, release, err = openSandbox(ctx, env, fs, ws, opts); err != nil {
			return nil, nil
		}
	}
	return sb, func() { _ = release() }
}
