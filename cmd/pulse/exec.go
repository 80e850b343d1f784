package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

// exitSandbox is exec's exit code when the sandbox itself failed (no
// backend, refused by policy), as distinct from the command's own code;
// 124 and 137 follow timeout(1) and a SIGKILLed shell.
const (
	exitSandbox = 125
	exitTimeout = 124
	exitKilled  = 137
)

func init() {
	register(command{
		name:    "exec",
		summary: "run a command in a sandbox and show what it wrote as a diff",
		usage:   []string{"pulse exec [flags] -- CMD [ARGS...]", "pulse exec [flags] 'SCRIPT'"},
		help: `Runs CMD in a sandbox of the workspace. What it writes is staged as a pending
transaction, shown as a diff; review it with 'pulse cow'. One argument with shell
syntax is run as a bash script. Exit code: the command's own, 124 when it timed
out, 125 when the sandbox could not run it or could not stage what it
wrote (the error says why; --json: "error"), 128+N when pulse got signal N.
On a terminal the command's output passes through a filter: text, colours and
cursor moves pass; sequences that act outside the screen (OSC: clipboard,
title, links, colours; DCS, APC, PM, SOS; queries the terminal would answer as
typed input) are held back and counted after the summary, and the terminal's
colours and modes are reset before it. --raw sends the output as it is. Into a
pipe or a file the output is byte for byte.
--unsafe-host lets the command run unisolated on this machine when nothing
isolates (or with --backend host); a rule of the policy the host cannot
enforce is still refused unless named: --unsafe-host=network,secrets
accepts that the network and the secrets on disk are open to the command
(also reads: read-deny rules, limits: memory, cpu and pids). 'pulse doctor
--unsafe-host' shows what the host enforces.
--allow-host HOST[:PORT] lets the command reach that host through the egress
proxy (the only way out: no route, no resolver); the hosts it was refused are
listed after it, each with the reason the audit log has.
What a command ran in stays for the next pulse exec (PULSE_KEEP_WARM: how
long it may stay unused, default 5m; 0: nothing stays; PULSE_DOCKER_IDLE is
its older name): on Docker the container, which the next pulse exec in this
workspace takes over; on namespace a keeper process that holds a sandbox
init ready for the next pulse exec of this user.
--json prints {execution_id, command, backend, exit_code, termination_reason,
duration_ms, stdout, stderr, transaction, staged, refused, diff, metrics:
{max_rss_bytes, user_cpu_ms, system_cpu_ms}, network_refused,
network_refusals: [{destination, reason, cut}], error}. A refusal is "cut"
when the destination is allowed and the proxy refused what the command sent
through it (a request in a tunnel naming another host).`,
		run: runExec,
	})
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runExec(ctx context.Context, env *cliEnv, args []string) int {
	fs := newFlagSet(env, "exec")
	sf := addSandboxFlags(fs)
	autoCommit := fs.Bool("auto-commit", false, "commit the command's writes at once (conflicts are reported, never overwritten)")
	timeout := fs.Duration("timeout", 0, "command timeout; may only shorten the policy's (default 10m)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on stdout")
	raw := fs.Bool("raw", false, "send the command's output to a terminal as it is, escape sequences that act outside the screen (clipboard, title, colours, queries) included")
	var envVars stringList
	fs.Var(&envVars, "env", "`K=V` added to the command's environment (repeatable)")
	cwd := fs.String("cwd", "", "working directory of the command, relative to the workspace (default: its root)")
	session := fs.String("session", "", "run in the shell session `NAME` of this workspace: start in the directory and with the exported variables its last command left, and keep what this one leaves (each command is still its own transaction)")
	if code, done := parseFlags(env, fs, args); done {
		return code
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return usageError(env, fs, "no command given")
	}
	if *session != "" {
		if err := checkSessionName(*session); err != nil {
			return usageError(env, fs, err.Error())
		}
		if *cwd != "" {
			return usageError(env, fs, "--session keeps its own directory; cd in the command instead of --cwd")
		}
	}
	cmdEnv := map[string]string{}
	for _, kv := range envVars {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, "\x00") {
			return usageError(env, fs, fmt.Sprintf("--env wants K=V, got %q", kv))
		}
		cmdEnv[k] = v
	}
	workspace := sf.workspace
	opts, err := sf.options(env.getenv, func(w string) { fmt.Fprintf(env.stderr, "pulse exec: warning: %s\n", w) })
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse exec: %v\n", err)
		return exitUsage
	}
	if *autoCommit {
		opts = append(opts, sandbox.WithAutoCommit())
	}
	// One command per process: an init started ahead for a next one
	// would only be killed at exit. A daemon's sandbox runs the next.
	if env.hold == nil {
		opts = append(opts, sandbox.WithoutPrestart())
	}
	// What the command ran in outlives this process, for the next
	// command: on Docker the container, on namespace the keeper with an
	// init ready (PULSE_KEEP_WARM: how long unused; 0 turns it off).
	if opts, err = withKeepWarm(env.getenv, opts); err != nil {
		fmt.Fprintf(env.stderr, "pulse exec: %v\n", err)
		return exitUsage
	}
	// A large upload to a pulse-server shows a progress line on a terminal.
	prog := newProgress(env)
	defer prog.close()
	opts = append(opts, sandbox.WithRemoteOptions(remote.WithProgress(prog.set)))

	sb, release, err := openSandbox(ctx, env, fs, *workspace, opts) // daemon.go
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse exec: %v\n", err)
		if errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrUnsupportedPolicy) {
			return exitSandbox // the sandbox cannot run it: no backend, or one the policy refuses
		}
		return exitUsage
	}
	defer func() {
		// What the sandbox could not remove (a run directory, a
		// container) is in the audit log; the person who ran the
		// command is told too, since nothing removes it later.
		if err := release(); err != nil {
			fmt.Fprintf(forTerminal(env.stderr), "pulse exec: warning: cleanup failed, left behind (remove by hand; the audit log has it): %v\n", err)
		}
	}()
	if env.getenv("PULSE_REMOTE_URL") != "" && sb.Backend().Name() != "remote" {
		for _, why := range sb.PassedOver() {
			if strings.HasPrefix(why, "remote:") {
				fmt.Fprintf(env.stderr, "pulse: WARNING: PULSE_REMOTE_URL is set but the remote backend is unavailable (%s); running on the %s backend on this machine\n",
					strings.TrimSpace(strings.TrimPrefix(why, "remote:")), sb.Backend().Name())
			}
		}
	}
	if sb.Capabilities().Isolation == backend.IsolationHostUnsafe && !*asJSON {
		fmt.Fprintln(env.stderr, "pulse: WARNING: UNSAFE_HOST: running unisolated on this machine, writing in the workspace itself")
	}

	cmd := sandbox.Command{Args: argv, Stdin: env.stdin, Dir: *cwd, Env: cmdEnv}
	if len(argv) == 1 && strings.ContainsAny(argv[0], " \t;|&<>$`'\"") {
		// One argument with shell syntax is a script, as with ssh.
		cmd.Args, cmd.Shell = nil, argv[0]
	}
	var outFilter, errFilter *termFilter
	if !*asJSON {
		cmd.Stdout, outFilter = commandOutput(env.stdout, *raw)
		cmd.Stderr, errFilter = commandOutput(env.stderr, *raw)
		// The command's output reaches the CLI's stdout in chunks of
		// backend.OutputChunk; into a default 64 KiB pipe each chunk
		// is four writes, each a wake-up of this process and of the
		// reader. Only the buffer's size changes.
		backend.GrowPipe(env.stdout)
	}
	if *timeout > 0 {
		l := policy.ResourceLimits{Timeout: *timeout}
		cmd.Limits = &l
	}
	var res *sandbox.Result
	if *session != "" {
		res, err = runInSession(ctx, sb, *session, cmd, func(w string) { fmt.Fprintf(env.stderr, "pulse exec: warning: %s\n", w) }) // session.go
	} else {
		res, err = sb.Execute(ctx, cmd)
	}
	for _, f := range []*termFilter{outFilter, errFilter} {
		if f != nil {
			f.Close()
		}
	}
	if err != nil && res == nil {
		fmt.Fprintf(forTerminal(env.stderr), "pulse exec: %v\n", err)
		if hint := refusalHint(sb, err); hint != "" {
			fmt.Fprintf(env.stderr, "pulse exec: %s\n", hint)
		}
		if errors.Is(err, sandbox.ErrPendingInTheWay) {
			fmt.Fprintf(env.stderr, "pulse exec: the pending transactions: pulse cow list; commit them all: pulse cow commit --all\n")
		}
		return exitSandbox
	}

	diff := ""
	if res.Transaction != "" {
		// What this command changed in what it saw: relative to the
		// pending stack below it.
		diff, _ = sb.PreviewStack(ctx, res.Transaction)
	}
	if *asJSON {
		writeExecJSON(env.stdout, res, diff, err)
	} else {
		wsFlag := ""
		if *workspace != "." {
			wsFlag = " --workspace " + shellQuote(*workspace)
		}
		resetTerminal(env.stderr)
		summarize(forTerminal(env.stderr), res, diff, env.prog+" cow", wsFlag, err, sf.policyDisk)
		if held := heldBack(outFilter, errFilter); held != "" {
			fmt.Fprintf(forTerminal(env.stderr), "   held back from the terminal: %s (sequences that act outside the screen; --raw sends them)\n", held)
		}
	}
	// A Result with an error: the command ran, but the sandbox failed
	// after it. Its writes were lost (backend.ErrOverlayLost) or not all
	// staged, or its output was not all delivered: what the result shows
	// is not all the command did, so the error is shown with it and the
	// exit code is the sandbox's, never the command's own 0 over writes
	// that are nowhere. (Cancelled by a signal: main exits 128+N.)
	if err != nil {
		fmt.Fprintf(forTerminal(env.stderr), "pulse exec: %v\n", err)
		return exitSandbox
	}
	return execExitCode(res)
}

// keepWarm is how long what a command ran in stays for a later pulse
// exec: PULSE_KEEP_WARM (or its older name PULSE_DOCKER_IDLE) as a
// duration (at least a minute), 0 for not at all.
// withKeepWarm is opts with sandbox.WithKeepWarm of keepWarm's duration
// appended, when there is one.
func withKeepWarm(getenv func(string) string, opts []sandbox.Option) ([]sandbox.Option, error) {
	keep, err := keepWarm(getenv)
	if err != nil {
		return nil, err
	}
	if keep > 0 {
		opts = append(opts, sandbox.WithKeepWarm(keep))
	}
	return opts, nil
}

func keepWarm(getenv func(string) string) (time.Duration, error) {
	name := "PULSE_KEEP_WARM"
	v := getenv(name)
	if v == "" {
		name = "PULSE_DOCKER_IDLE"
		v = getenv(name)
	}
	if v == "" {
		return docker.DefaultReuseIdle, nil
	}
	if v == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || (d != 0 && d < time.Minute) {
		return 0, fmt.Errorf("%s=%q: want a duration of at least 1m, or 0", name, v)
	}
	return d, nil
}

func execExitCode(res *sandbox.Result) int {
	switch res.Termination {
	case backend.Timeout:
		return exitTimeout
	case backend.Exited:
		return res.ExitCode & 0xff
	}
	if res.ExitCode > 0 {
		return res.ExitCode & 0xff
	}
	return exitKilled
}

// summarize tells a person where the command's writes went. cow is how
// they run the review command ("pulse cow", or "go run ./cmd/pulse cow"
// when that is how they ran this one); wsFlag is the --workspace flag it
// needs ("" for the current directory); failed, the error the sandbox
// returned with res (nil when none), since then what is staged need not
// be all the command wrote; policyDisk, the policy's limits.disk_bytes
// (0: it sets none), so that a command stopped at the disk bound is told
// which bound that was.
func summarize(w io.Writer, res *sandbox.Result, diff, cow, wsFlag string, failed error, policyDisk int64) {
	// The code pulse exits with, not the backend's raw one: a command
	// killed at a bound (disk_limit, OOM) has ExitCode 0 or -1, and pulse
	// exits 137 for it; the summary must not say otherwise.
	fmt.Fprintf(w, "\n── pulse: %s backend, exit %d (%s) in %s\n", res.Backend, execExitCode(res), res.Termination,
		res.Duration.Round(time.Millisecond))
	if res.Truncated {
		fmt.Fprintln(w, "   output was truncated at the output cap")
	}
	if res.Termination == backend.OOM && res.Metrics.DiskBytes > 0 {
		fmt.Fprintf(w, "   out of memory; what it wrote took %s of it (on this backend a command's writes are held in memory"+
			" and count toward limits.memory_bytes): raise limits.memory_bytes in the policy\n", humanBytes(res.Metrics.DiskBytes))
	}
	if res.Termination == backend.DiskLimit {
		switch res.Isolation {
		case backend.IsolationContainer, backend.IsolationRemote:
			// A container has two bounded spaces, and only the
			// workspace's is limits.disk_bytes; /tmp's size is fixed.
			// The backend's own line says which one filled.
			size := "the backend's default, the policy setting none"
			if policyDisk > 0 {
				size = humanBytes(policyDisk) + " in the policy"
			}
			fmt.Fprintf(w, "   stopped at a disk bound: what it wrote filled the workspace space (limits.disk_bytes: %s) or /tmp (fixed);"+
				" the disk_limit line above says which and how to make room; its writes up to there are staged, the last file perhaps cut short\n", size)
		default:
			bound := "the backend's default (the policy sets no limits.disk_bytes; pulse doctor says how this backend sizes it)"
			raise := "set limits.disk_bytes in the policy"
			if policyDisk > 0 {
				bound, raise = "limits.disk_bytes of the policy, "+humanBytes(policyDisk), "raise limits.disk_bytes in the policy"
			}
			fmt.Fprintf(w, "   stopped at the disk bound: what it wrote reached %s;"+
				" its writes up to there are staged, the last file perhaps cut short; %s to allow more\n", bound, raise)
		}
	}
	printNetworkRefusals(w, res)
	for _, r := range res.Refused {
		fmt.Fprintf(w, "   not staged: %s (%s)\n", r.Path, r.Reason)
	}
	if len(res.ConcurrentChanges) > 0 {
		id := res.Transaction
		if id == "" {
			id = "ID"
		}
		fmt.Fprintf(w, "   warning: %s changed while this command ran (another command's transaction or commit, or an edit), "+
			"and this command did not see the change; %s diff%s %s shows what its version replaces\n",
			namedPaths(res.ConcurrentChanges), cow, wsFlag, id)
	}
	switch {
	case res.InPlace:
		if len(res.Changed)+len(res.Deleted) == 0 {
			fmt.Fprintln(w, "   the host backend wrote in place; no file changed")
			return
		}
		fmt.Fprintln(w, "   the host backend wrote IN PLACE (nothing to review or undo):")
		for _, p := range res.Changed {
			fmt.Fprintf(w, "     changed  %s\n", p)
		}
		for _, p := range res.Deleted {
			fmt.Fprintf(w, "     deleted  %s\n", p)
		}
	case len(res.Committed) > 0:
		fmt.Fprintf(w, "   committed %d path(s): %s\n", len(res.Committed), namedPaths(res.Committed))
	case res.Transaction != "":
		if res.CommitErr != nil {
			fmt.Fprintf(w, "   not committed: %v\n", res.CommitErr)
		}
		fmt.Fprintf(w, "   pending transaction %s (%d path(s)); the workspace is untouched:\n\n", res.Transaction, len(res.Staged))
		fmt.Fprint(w, hostRunWarning(res.RunsOnHost))
		shown, more := clipDiff(diff)
		fmt.Fprint(w, shown)
		if more > 0 {
			fmt.Fprintf(w, "\n   ... and %d more line(s) of diff (%s diff%s %s shows it whole; --json has it too)\n",
				more, cow, wsFlag, res.Transaction)
		}
		fmt.Fprintf(w, "\n   review: %[3]s diff%[2]s %[1]s | commit: %[3]s commit%[2]s %[1]s | drop: %[3]s discard%[2]s %[1]s\n",
			res.Transaction, wsFlag, cow)
	case failed != nil:
		fmt.Fprintln(w, "   nothing staged: the sandbox failed after the command ran (below)")
	default:
		fmt.Fprintln(w, "   no file changed")
	}
}

// printNetworkRefusals tells, for each destination the egress proxy
// refused, why, as the audit log has it. A destination the allowlist does
// not hold gets the --allow-host hint; one it holds whose connection was
// cut for what went through it does not, since allowing it again would
// change nothing.
func printNetworkRefusals(w io.Writer, res *sandbox.Result) {
	var refused, cut []string
	for _, r := range res.NetworkRefusals {
		line := r.Destination + " (" + r.Reason + ")"
		if r.Cut {
			cut = append(cut, line)
		} else {
			refused = append(refused, line)
		}
	}
	if len(res.NetworkRefusals) == 0 && len(res.NetworkRefused) > 0 {
		// A result without reasons (an older server's): the hosts alone.
		refused = res.NetworkRefused
	}
	if len(refused) > 0 {
		fmt.Fprintf(w, "   network refused: %s; --allow-host HOST:PORT allows a destination; each refusal is in the audit log\n",
			strings.Join(refused, ", "))
	}
	if len(cut) > 0 {
		fmt.Fprintf(w, "   network cut: %s; the destination is allowed, what the command sent through it was not; each is in the audit log\n",
			strings.Join(cut, ", "))
	}
}

// The summary shows a diff up to this many lines or bytes, whichever
// comes first: a command that wrote a build tree or a large file would
// otherwise flood the terminal (and an agent's context) with megabytes.
const (
	maxSummaryDiffLines = 500
	maxSummaryDiffBytes = 64 << 10
)

// clipDiff returns the head of diff the summary shows, cut at a line end,
// and how many lines it leaves out.
func clipDiff(diff string) (string, int) {
	end, lines := 0, 0
	for end < len(diff) && lines < maxSummaryDiffLines {
		i := strings.IndexByte(diff[end:], '\n')
		next := len(diff)
		if i >= 0 {
			next = end + i + 1
		}
		if next > maxSummaryDiffBytes && lines > 0 {
			break
		}
		end, lines = next, lines+1
	}
	if end >= len(diff) {
		return diff, 0
	}
	rest := strings.TrimSuffix(diff[end:], "\n")
	return diff[:end], strings.Count(rest, "\n") + 1
}

// maxNamedPaths is how many committed paths the summary names. A command
// that wrote thousands of files would otherwise print them all on one line;
// --json and the audit log keep the whole list.
const maxNamedPaths = 20

// namedPaths lists paths for the summary, the first maxNamedPaths of them
// and a count of the rest.
func namedPaths(paths []string) string {
	if len(paths) <= maxNamedPaths {
		return strings.Join(paths, ", ")
	}
	return fmt.Sprintf("%s and %d more (--json lists them all)", strings.Join(paths[:maxNamedPaths], ", "), len(paths)-maxNamedPaths)
}

// execMetrics is backend.Metrics with the CPU times in milliseconds, as
// pulse-server's protocol reports them, rather than as bare nanoseconds.
type execMetrics struct {
	MaxRSSBytes int64   `json:"max_rss_bytes"`
	UserCPUMS   float64 `json:"user_cpu_ms"`
	SystemCPUMS float64 `json:"system_cpu_ms"`
}

// durationMS is d in milliseconds, to the microsecond.
func durationMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func writeExecJSON(w io.Writer, res *sandbox.Result, diff string, failed error) {
	type refused struct {
		Path   string `json:"path"`
		Reason string `json:"reason"`
	}
	type netWhy struct {
		Destination string `json:"destination"`
		Reason      string `json:"reason"`
		Cut         bool   `json:"cut"`
	}
	out := struct {
		ExecutionID string      `json:"execution_id"`
		Command     string      `json:"command"`
		Backend     string      `json:"backend"`
		Isolation   string      `json:"isolation_level"`
		ExitCode    int         `json:"exit_code"`
		Termination string      `json:"termination_reason"`
		TimedOut    bool        `json:"timed_out"`
		Truncated   bool        `json:"truncated"`
		DurationMS  float64     `json:"duration_ms"`
		Stdout      string      `json:"stdout"`
		Stderr      string      `json:"stderr"`
		Transaction string      `json:"transaction,omitempty"`
		Staged      []string    `json:"staged,omitempty"`
		Concurrent  []string    `json:"concurrent_changes,omitempty"`
		Refused     []refused   `json:"refused,omitempty"`
		Committed   []string    `json:"committed,omitempty"`
		RunsOnHost  []string    `json:"runs_on_host,omitempty"`
		CommitError string      `json:"commit_error,omitempty"`
		InPlace     bool        `json:"in_place"`
		Changed     []string    `json:"changed,omitempty"`
		Deleted     []string    `json:"deleted,omitempty"`
		Diff        string      `json:"diff,omitempty"`
		Metrics     execMetrics `json:"metrics"`
		NetRefused  []string    `json:"network_refused,omitempty"`
		NetWhy      []netWhy    `json:"network_refusals,omitempty"`
		Error       string      `json:"error,omitempty"`
	}{
		ExecutionID: res.ExecutionID, Command: res.Command, Backend: res.Backend, Isolation: string(res.Isolation),
		ExitCode: res.ExitCode, Termination: string(res.Termination), TimedOut: res.TimedOut, Truncated: res.Truncated,
		DurationMS: durationMS(res.Duration), Stdout: res.Stdout, Stderr: res.Stderr,
		Transaction: res.Transaction, Staged: res.Staged, Concurrent: res.ConcurrentChanges, Committed: res.Committed, RunsOnHost: res.RunsOnHost, InPlace: res.InPlace,
		Changed: res.Changed, Deleted: res.Deleted, Diff: diff,
		Metrics: execMetrics{MaxRSSBytes: res.Metrics.MaxRSSBytes,
			UserCPUMS: durationMS(res.Metrics.UserCPU), SystemCPUMS: durationMS(res.Metrics.SystemCPU)},
		NetRefused: res.NetworkRefused,
	}
	for _, r := range res.Refused {
		out.Refused = append(out.Refused, refused{r.Path, r.Reason})
	}
	for _, r := range res.NetworkRefusals {
		out.NetWhy = append(out.NetWhy, netWhy{r.Destination, r.Reason, r.Cut})
	}
	if res.CommitErr != nil {
		out.CommitError = res.CommitErr.Error()
	}
	if failed != nil {
		out.Error = failed.Error()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// shellQuote quotes s for a POSIX shell when it needs it, so that a hint
// can be pasted as printed.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
