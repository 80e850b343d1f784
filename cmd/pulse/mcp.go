package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

func init() {
	register(command{
		name:    "mcp",
		summary: "serve the sandbox to an MCP client over stdio (execute, files, stack, processes)",
		usage:   []string{"pulse mcp [--workspace DIR] [--policy FILE] [--backend B] [flags]"},
		help: `Speaks the Model Context Protocol on stdin and stdout. Tools: execute, read_file,
list_files, write_file, diff, commit, discard, squash; for background processes
start, process_output, send_input, kill, list_processes and expose. Policy, secrets, the
egress allowlist (--allow-host) and the audit log apply as for 'pulse exec';
a refused action is a tool error that says why, a refused connection is in
the result's network_refused. A message the server cannot take (over its
limit of 50 MiB of base64 file content plus 1 MiB, not JSON-RPC) is answered
with a JSON-RPC error and serving goes on.
A client starts it, for example: {"command": "pulse", "args": ["mcp", "--workspace", "/repo"]}`,
		run: runMCP,
	})
}

const mcpInstructions = `Pulse runs your commands in an isolated sandbox of one workspace.
Nothing a command writes reaches the workspace directly: its writes become a
pending transaction (the "transaction" of a result), and the next command
sees the workspace with every pending transaction on top (the pending stack).
Use diff to see what is pending; commit with no id applies the whole stack
as one commit, discard with no id drops it, squash folds it into one
transaction. read_file and list_files show the workspace as the next command
sees it (pending writes included). For a server or
a watcher, start runs a command in the background: process_output reads what
it printed (from an offset, so only what is new), send_input writes to its
input, kill ends it, expose makes a port it listens on reachable. The policy decides what is allowed; a
refusal comes back as a tool error that says why, and hosts the network
policy refused a command are in its result's network_refused.`

// runMCP implements `pulse mcp`: one sandbox for the life of the server,
// every tool call going through the sandbox facade, so that policy,
// secret scrubbing and the audit log apply exactly as for `pulse exec`.
// The protocol comes from the official Go SDK; stdout carries only
// protocol messages, and everything for a person goes to stderr.
func runMCP(ctx context.Context, env *cliEnv, args []string) int {
	fs := newFlagSet(env, "mcp")
	sf := addSandboxFlags(fs)
	if code, done := parseNoArgs(env, fs, args); done {
		return code
	}
	opts, err := sf.options(env.getenv, func(w string) { fmt.Fprintf(env.stderr, "pulse mcp: warning: %s\n", w) })
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse mcp: %v\n", err)
		return exitUsage
	}
	if env.hold != nil {
		// In the daemon the sandbox may serve `pulse exec` next: opened
		// as exec opens it there.
		if opts, err = withKeepWarm(env.getenv, opts); err != nil {
			fmt.Fprintf(env.stderr, "pulse mcp: %v\n", err)
			return exitUsage
		}
	}
	sb, release, err := openSandbox(ctx, env, fs, *sf.workspace, opts) // daemon.go
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse mcp: %v\n", err)
		if errors.Is(err, sandbox.ErrUnavailable) {
			return exitSandbox
		}
		return exitUsage
	}
	if sb.Capabilities().Isolation == backend.IsolationHostUnsafe {
		fmt.Fprintln(env.stderr, "pulse mcp: WARNING: UNSAFE_HOST: commands run unisolated on this machine, writing in the workspace itself")
	}
	fmt.Fprintf(env.stderr, "pulse mcp: serving workspace %s on the %s backend over stdio; audit log %s\n",
		sb.Workspace(), sb.Backend().Name(), sb.AuditPath())

	srv, tools := newMCPServer(sb)
	defer func() {
		// A sandbox the daemon holds outlives the session: what the
		// session started in it ends with the session.
		if env.hold != nil && tools.endSession() {
			env.hold.retire(sb)
		}
		_ = release()
	}()
	in := env.stdin
	if env.hold != nil {
		// The client's stdin, passed to the daemon, is read until the
		// session ends, not until the client's end of it closes.
		var stop func()
		in, stop = cancelableStdin(ctx, in)
		defer stop()
	}
	// Every line goes through frameReader, which answers what the SDK
	// would end the session on; the SDK's own cap stays, above ours.
	out := &lockedWriter{w: env.stdout}
	t := &mcp.IOTransport{Reader: io.NopCloser(newFrameReader(in, mcpFrameLimit, out)), Writer: nopWriteCloser{out},
		MaxLineLength: mcpFrameLimit + 64<<10}
	if err := srv.Run(ctx, t); err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(env.stderr, "pulse mcp: %v\n", err)
		return exitFailure
	}
	// Ended by a signal, main turns this into 128+N.
	return exitOK
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// mcpTools holds the sandbox the tools act on.
type mcpTools struct {
	sb    *sandbox.Sandbox
	procs mcpProcs
	// exposed: a port was exposed, which stays open until the sandbox
	// closes.
	exposed atomic.Bool
}

// endSession kills what the session started and reports whether it left
// anything in the sandbox that only closing the sandbox ends (exposed
// ports, the logs of its processes): a held sandbox is then not kept.
func (t *mcpTools) endSession() (leftState bool) {
	procs := t.procs.all()
	for _, p := range procs {
		_ = p.Kill()
	}
	return len(procs) > 0 || t.exposed.Load()
}

func newMCPServer(sb *sandbox.Sandbox) (*mcp.Server, *mcpTools) {
	t := &mcpTools{sb: sb}
	srv := mcp.NewServer(&mcp.Implementation{Name: "pulse", Title: "Pulse sandbox", Version: buildVersion().Version},
		&mcp.ServerOptions{Instructions: mcpInstructions})
	mcp.AddTool(srv, &mcp.Tool{Name: "execute", Description: "Run a shell script (bash -c) in the sandbox. " +
		"Returns its exit code, its output (scrubbed of secrets) and the id of the pending transaction holding the files it wrote."}, t.execute)
	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: "Read a file as the next command sees it: the workspace plus every " +
		"pending transaction (pending_transactions names those that change it).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.readFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_files", Description: "List a directory as the next command sees it, pending writes included (default: the workspace root).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.listFiles)
	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Write a file, staged as a new pending transaction " +
		"(the workspace is untouched until it is committed). The policy decides whether the path may be written."}, t.writeFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "diff", Description: "Show pending changes as a unified diff: one transaction by id, or every pending one.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.diff)
	mcp.AddTool(srv, &mcp.Tool{Name: "commit", Description: "Apply pending changes to the workspace. Without an id: the whole pending stack, " +
		"in order, as one commit (all or nothing) — what an agent wants after edit, test and fix. With an id: that transaction alone, " +
		"refused (naming the transactions it shares paths with) when another pending one changes the same paths. " +
		"A file changed by someone else since it was staged stops the commit; nothing is overwritten."}, t.commit)
	mcp.AddTool(srv, &mcp.Tool{Name: "discard", Description: "Drop pending changes. Without an id: the whole pending stack. " +
		"With an id: that transaction, refused (naming them) while transactions made on top of it are pending.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}}, t.discard)
	mcp.AddTool(srv, &mcp.Tool{Name: "squash", Description: "Fold the whole pending stack into one pending transaction with the same effect " +
		"(to review or commit it as one); nothing reaches the workspace.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, t.squash)
	addProcessTools(srv, t)
	return srv, t
}

func ptr[T any](v T) *T { return &v }

type executeIn struct {
	Command        string            `json:"command" jsonschema:"the shell script to run with bash -c"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory, relative to the workspace root (default: the root)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added to the command's minimal environment"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default and ceiling: the policy's timeout, else 10 minutes)"`
}

type refusedOut struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

type netRefusedOut struct {
	Destination string `json:"destination" jsonschema:"host:port the command tried to reach"`
	Reason      string `json:"reason" jsonschema:"why the egress proxy refused it, as the audit log has it"`
	Cut         bool   `json:"cut,omitempty" jsonschema:"true when the destination is allowed and the proxy cut the connection for what the command sent through it"`
}

type executeOut struct {
	ExitCode    int             `json:"exit_code"`
	Termination string          `json:"termination_reason" jsonschema:"exited, signaled, timeout, cancelled, output_limit, oom or disk_limit (its writes reached the policy's limits.disk_bytes; what it wrote up to there is staged)"`
	TimedOut    bool            `json:"timed_out"`
	Truncated   bool            `json:"truncated" jsonschema:"true when output passed the output cap and was cut"`
	Stdout      string          `json:"stdout"`
	Stderr      string          `json:"stderr"`
	Transaction string          `json:"transaction,omitempty" jsonschema:"id of the pending transaction holding the files the command wrote"`
	Staged      []string        `json:"staged,omitempty" jsonschema:"paths staged in the transaction"`
	Concurrent  []string        `json:"concurrent_changes,omitempty" jsonschema:"staged paths that changed while this command ran (another command's transaction or commit, or an edit) without it seeing the change; auto-commit leaves such a transaction pending"`
	Refused     []refusedOut    `json:"refused,omitempty" jsonschema:"paths the command wrote that were not staged, with why"`
	NetRefused  []netRefusedOut `json:"network_refused,omitempty" jsonschema:"destinations the egress proxy refused the command, with why (the command itself saw a 403 or a closed connection)"`
	InPlace     bool            `json:"in_place,omitempty" jsonschema:"true when the unsafe host backend wrote in the workspace itself"`
	DurationMS  float64         `json:"duration_ms" jsonschema:"wall-clock duration in milliseconds"`
	Backend     string          `json:"backend"`
}

func (t *mcpTools) execute(ctx context.Context, _ *mcp.CallToolRequest, in executeIn) (*mcp.CallToolResult, executeOut, error) {
	cmd, err := in.command()
	if err != nil {
		return nil, executeOut{}, err
	}
	res, err := t.sb.Execute(ctx, cmd)
	if res == nil {
		if err == nil {
			err = errors.New("the sandbox returned no result")
		}
		return nil, executeOut{}, mcpRefusal(t.sb, err)
	}
	out := toExecuteOut(res)
	if err != nil {
		// The command ran but the call was cancelled. The SDK drops the
		// structured result of a handler that returns an error, and with
		// it the partial output, so the error goes in the result itself.
		return partialResult(out, fmt.Errorf("%w (transaction %q)", err, res.Transaction)), out, nil
	}
	return resultText(out), out, nil
}

// partialResult is the tool error of a command that ran and was cut
// short: marked is_error, its text the error, then the result (output so
// far, exit information) as JSON; structured content carries the result.
func partialResult(out executeOut, err error) *mcp.CallToolResult {
	text := err.Error()
	if b, jerr := json.Marshal(out); jerr == nil {
		text += "\n" + string(b)
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

// mcpRefusal adds to a refused command's error what the agent can do
// about it, in the tools it has: the sandbox's own words name none.
func mcpRefusal(sb *sandbox.Sandbox, err error) error {
	if hint := refusalHint(sb, err); hint != "" {
		err = fmt.Errorf("%w; %s", err, hint)
	}
	if errors.Is(err, sandbox.ErrPendingInTheWay) {
		err = fmt.Errorf("%w; call diff to see the pending transactions, then commit without an id to commit the whole stack, "+
			"or discard (without an id: all of it)", err)
	}
	return err
}

// command is the sandbox command in describes.
func (in executeIn) command() (sandbox.Command, error) {
	if strings.TrimSpace(in.Command) == "" {
		return sandbox.Command{}, errors.New("command is empty")
	}
	cmd := sandbox.Command{Shell: in.Command, Dir: in.Cwd, Env: in.Env}
	if in.TimeoutSeconds != 0 {
		if in.TimeoutSeconds < 0 || math.IsNaN(in.TimeoutSeconds) || in.TimeoutSeconds > float64(math.MaxInt64/int64(time.Second)) {
			return cmd, fmt.Errorf("timeout_seconds must be a positive number of seconds, got %v", in.TimeoutSeconds)
		}
		// A zero field keeps the policy's limit; a timeout past the
		// policy's is refused by the facade.
		cmd.Limits = &policy.ResourceLimits{Timeout: time.Duration(in.TimeoutSeconds * float64(time.Second))}
	}
	return cmd, nil
}

func toExecuteOut(res *sandbox.Result) executeOut {
	out := executeOut{
		ExitCode: res.ExitCode, Termination: string(res.Termination), TimedOut: res.TimedOut, Truncated: res.Truncated,
		Stdout: res.Stdout, Stderr: res.Stderr, Transaction: res.Transaction, Staged: res.Staged, Concurrent: res.ConcurrentChanges, InPlace: res.InPlace,
		DurationMS: float64(res.Duration.Microseconds()) / 1000, Backend: res.Backend,
	}
	for _, r := range res.Refused {
		out.Refused = append(out.Refused, refusedOut{r.Path, r.Reason})
	}
	for _, r := range res.NetworkRefusals {
		out.NetRefused = append(out.NetRefused, netRefusedOut{r.Destination, r.Reason, r.Cut})
	}
	return out
}

// resultText is the text of a command's result: the result as JSON, as
// the SDK gives it by default, and, when the egress proxy refused the
// command, a line that says so as `pulse exec` does. The command itself
// saw only a 403 or a closed connection.
func resultText(out executeOut) *mcp.CallToolResult {
	if len(out.NetRefused) == 0 {
		return nil // the SDK's default: the JSON alone
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}, &mcp.TextContent{Text: netRefusedText(out.NetRefused)}}}
}

func netRefusedText(rs []netRefusedOut) string {
	var refused, cut []string
	for _, r := range rs {
		line := r.Destination + " (" + r.Reason + ")"
		if r.Cut {
			cut = append(cut, line)
		} else {
			refused = append(refused, line)
		}
	}
	var lines []string
	if len(refused) > 0 {
		lines = append(lines, "network refused: "+strings.Join(refused, ", ")+"; retrying will not help: the policy's network allowlist, "+
			"or --allow-host HOST:PORT where this pulse mcp is started, allows a destination (ask whoever runs it); each refusal is in the audit log")
	}
	if len(cut) > 0 {
		lines = append(lines, "network cut: "+strings.Join(cut, ", ")+"; the destination is allowed, what the command sent through it was not; each is in the audit log")
	}
	return strings.Join(lines, "\n")
}

type pathIn struct {
	Path string `json:"path" jsonschema:"path relative to the workspace root"`
}

type readFileOut struct {
	Path                string   `json:"path"`
	Content             string   `json:"content"`
	Encoding            string   `json:"encoding" jsonschema:"utf-8, or base64 for content that is not valid UTF-8"`
	SizeBytes           int      `json:"size_bytes"`
	PendingTransactions []string `json:"pending_transactions,omitempty" jsonschema:"pending transactions that change this path; the content shown includes them"`
}

func (t *mcpTools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, readFileOut, error) {
	data, err := t.sb.ReadFile(ctx, in.Path)
	if err != nil {
		return nil, readFileOut{}, err
	}
	out := readFileOut{Path: in.Path, SizeBytes: len(data), Encoding: "utf-8", Content: string(data)}
	if !utf8.Valid(data) {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	out.PendingTransactions = t.pendingFor(ctx, in.Path)
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out.Content}}}
	if len(out.PendingTransactions) > 0 {
		res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf(
			"note: this includes pending transaction(s) %s, not yet committed (see diff)", strings.Join(out.PendingTransactions, ", "))})
	}
	return res, out, nil
}

// pendingFor lists the pending transactions that stage a change to p.
func (t *mcpTools) pendingFor(ctx context.Context, p string) []string {
	rel := filepath.ToSlash(filepath.Clean(p))
	if filepath.IsAbs(p) {
		r, err := filepath.Rel(t.sb.Workspace(), p)
		if err != nil {
			return nil
		}
		rel = filepath.ToSlash(r)
	}
	txs, err := t.pending(ctx, "")
	if err != nil {
		return nil
	}
	var ids []string
	for _, tx := range txs {
		for _, c := range tx.Changes() {
			if c.Path == rel {
				ids = append(ids, tx.ID())
				break
			}
		}
	}
	return ids
}

type listIn struct {
	Path string `json:"path,omitempty" jsonschema:"directory relative to the workspace root (default: the root)"`
}

type listOut struct {
	Path    string             `json:"path"`
	Entries []sandbox.DirEntry `json:"entries"`
}

func (t *mcpTools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, listOut, error) {
	ents, err := t.sb.ListDir(ctx, in.Path)
	if err != nil {
		return nil, listOut{}, err
	}
	p := in.Path
	if p == "" {
		p = "."
	}
	return nil, listOut{Path: p, Entries: ents}, nil
}

type writeFileIn struct {
	Path     string `json:"path" jsonschema:"path relative to the workspace root"`
	Content  string `json:"content" jsonschema:"the whole new content of the file"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64"`
}

type writeFileOut struct {
	Path        string `json:"path"`
	Transaction string `json:"transaction" jsonschema:"id of the pending transaction holding the write"`
	SizeBytes   int    `json:"size_bytes"`
}

func (t *mcpTools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeFileIn) (*mcp.CallToolResult, writeFileOut, error) {
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		b, err := base64.StdEncoding.DecodeString(in.Content)
		if err != nil {
			return nil, writeFileOut{}, fmt.Errorf("content is not valid base64: %w", err)
		}
		data = b
	default:
		return nil, writeFileOut{}, fmt.Errorf("encoding must be utf-8 or base64, got %q", in.Encoding)
	}
	tx, err := t.sb.BeginTx(ctx, "write_file "+in.Path)
	if err != nil {
		return nil, writeFileOut{}, err
	}
	if err := tx.Write(ctx, in.Path, data, t.modeOf(in.Path)); err != nil {
		// Nothing was staged; the empty transaction would only be noise
		// in the review list.
		_ = tx.Discard(context.WithoutCancel(ctx))
		return nil, writeFileOut{}, err
	}
	return nil, writeFileOut{Path: in.Path, Transaction: tx.ID(), SizeBytes: len(data)}, nil
}

// modeOf keeps the permission bits of the file being replaced (a script
// stays executable); a new file gets 0644.
func (t *mcpTools) modeOf(p string) os.FileMode {
	if !filepath.IsAbs(p) {
		p = filepath.Join(t.sb.Workspace(), p)
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		return fi.Mode().Perm()
	}
	return 0o644
}

type idIn struct {
	ID string `json:"id,omitempty" jsonschema:"transaction id (default: the whole pending stack)"`
}

type txDiff struct {
	ID          string         `json:"id"`
	Description string         `json:"description"`
	Changes     []cowfs.Change `json:"changes"`
	Diff        string         `json:"diff"`
}

type diffOut struct {
	Transactions []txDiff `json:"transactions"`
}

// pending returns the transaction id names, or every pending one, oldest
// first.
func (t *mcpTools) pending(ctx context.Context, id string) ([]*sandbox.Tx, error) {
	if id != "" {
		tx, err := t.sb.OpenTx(ctx, id)
		if err != nil {
			return nil, err
		}
		return []*sandbox.Tx{tx}, nil
	}
	infos, err := t.sb.Transactions(ctx)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(infos, func(i, j int) bool { return infos[i].Created.Before(infos[j].Created) })
	var txs []*sandbox.Tx
	for _, info := range infos {
		if info.State != cowfs.StateOpen || info.Changes+info.Whiteouts == 0 {
			continue
		}
		tx, err := t.sb.OpenTx(ctx, info.ID)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, cowfs.ErrNotFound) {
			continue // committed or discarded by someone else meanwhile
		}
		if err != nil {
			return nil, err
		}
		txs = append(txs, tx)
	}
	return txs, nil
}

func (t *mcpTools) diff(ctx context.Context, _ *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, diffOut, error) {
	txs, err := t.pending(ctx, in.ID)
	if err != nil {
		return nil, diffOut{}, err
	}
	out := diffOut{Transactions: []txDiff{}}
	var text strings.Builder
	for _, tx := range txs {
		d, err := tx.Diff(ctx)
		if err != nil {
			return nil, diffOut{}, fmt.Errorf("transaction %s: %w", tx.ID(), err)
		}
		out.Transactions = append(out.Transactions, txDiff{ID: tx.ID(), Description: tx.Description(), Changes: tx.Changes(), Diff: d})
		fmt.Fprintf(&text, "# transaction %s: %s\n%s", tx.ID(), tx.Description(), d)
	}
	if len(txs) == 0 {
		text.WriteString("no pending transactions\n")
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text.String()}}}, out, nil
}

type commitOut struct {
	Transactions []string `json:"transactions" jsonschema:"the transactions committed, oldest first"`
	Paths        []string `json:"paths" jsonschema:"the workspace paths written"`
}

// commit applies one transaction, or, without an id, the whole pending
// stack as one all-or-nothing commit: an agent's fixes touch the files
// its earlier commands touched, and those transactions cannot be
// committed one by one.
func (t *mcpTools) commit(ctx context.Context, _ *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, commitOut, error) {
	out := commitOut{Transactions: []string{}, Paths: []string{}}
	if in.ID == "" {
		paths, ids, err := t.sb.CommitStack(ctx)
		if err != nil {
			return nil, out, mcpStackErr(fmt.Errorf("the pending stack was not committed, nothing was written: %w", err))
		}
		out.Transactions = append(out.Transactions, ids...)
		out.Paths = append(out.Paths, paths...)
		return mcpText(commitText(out)), out, nil
	}
	tx, err := t.sb.OpenTx(ctx, in.ID)
	if err != nil {
		return nil, out, err
	}
	paths, err := tx.Commit(ctx)
	if err != nil {
		return nil, out, mcpStackErr(fmt.Errorf("transaction %s not committed: %w", tx.ID(), err))
	}
	out.Transactions = append(out.Transactions, tx.ID())
	out.Paths = append(out.Paths, paths...)
	return mcpText(commitText(out)), out, nil
}

func commitText(out commitOut) string {
	if len(out.Transactions) == 0 {
		return "nothing pending, nothing committed"
	}
	return fmt.Sprintf("committed transaction(s) %s: %d path(s) written: %s",
		strings.Join(out.Transactions, ", "), len(out.Paths), strings.Join(out.Paths, ", "))
}

func mcpText(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// mcpStackErr says, in the tools an MCP client has, what to do about a
// refused commit or discard: the sandbox's own words name a command line
// the agent has no tool for.
func mcpStackErr(err error) error {
	var se *cowfs.StackError
	switch {
	case errors.As(err, &se) && se.Op == "discard":
		return fmt.Errorf("transaction %s cannot be discarded alone: transaction(s) %s were made on top of it (they also change %q) and depend on it; "+
			"discard those first (discard with their id), or call discard without an id to drop the whole pending stack: %w",
			se.ID, strings.Join(se.Others, ", "), se.Path, cowfs.ErrStackDependency)
	case errors.As(err, &se):
		return fmt.Errorf("transaction %s cannot be committed alone: it and pending transaction(s) %s change %q, so each depends on the other's order; "+
			"call commit without an id to commit the whole pending stack as one, or squash to fold it into one transaction first: %w",
			se.ID, strings.Join(se.Others, ", "), se.Path, cowfs.ErrStackDependency)
	case errors.Is(err, cowfs.ErrStackChanged):
		return fmt.Errorf("%w; another command staged a transaction meanwhile: look at diff, then call commit again", err)
	case errors.Is(err, sandbox.ErrRunsOnHost):
		// Held for a person by design: no tool commits it, and the agent
		// is told whom to ask rather than what to run.
		return fmt.Errorf("%w. No tool commits such a change: ask the person you work for to review and commit it (the review page or the CLI's cow commit), "+
			"or discard it", err)
	}
	return err
}

type discardOut struct {
	Discarded []string `json:"discarded" jsonschema:"the transactions dropped"`
}

// discard drops one transaction, or, without an id, the whole pending
// stack (but the empty transactions of commands still running).
func (t *mcpTools) discard(ctx context.Context, _ *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, discardOut, error) {
	out := discardOut{Discarded: []string{}}
	if in.ID == "" {
		ids, err := t.sb.DiscardAll(ctx)
		out.Discarded = append(out.Discarded, ids...)
		if err != nil {
			return nil, out, mcpStackErr(fmt.Errorf("the pending stack was not all discarded (dropped: %v): %w", ids, err))
		}
		return mcpText(discardText(out)), out, nil
	}
	tx, err := t.sb.OpenTx(ctx, in.ID)
	if err != nil {
		return nil, out, err
	}
	if err := tx.Discard(ctx); err != nil {
		return nil, out, mcpStackErr(fmt.Errorf("transaction %s not discarded: %w", tx.ID(), err))
	}
	out.Discarded = append(out.Discarded, tx.ID())
	return mcpText(discardText(out)), out, nil
}

func discardText(out discardOut) string {
	if len(out.Discarded) == 0 {
		return "nothing pending, nothing discarded"
	}
	return "discarded transaction(s) " + strings.Join(out.Discarded, ", ")
}

type squashOut struct {
	Transaction string   `json:"transaction,omitempty" jsonschema:"the one transaction that now holds the whole pending stack"`
	Squashed    []string `json:"squashed" jsonschema:"the transactions it replaced, oldest first"`
}

func (t *mcpTools) squash(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, squashOut, error) {
	out := squashOut{Squashed: []string{}}
	id, err := t.sb.Squash(ctx)
	if err != nil {
		return nil, out, fmt.Errorf("the pending stack was not squashed: %w", err)
	}
	if id == "" {
		return mcpText("nothing pending, nothing squashed"), out, nil
	}
	out.Transaction = id
	if st, err := t.sb.Stack(ctx); err == nil {
		for _, tx := range st {
			if tx.ID == id {
				out.Squashed = append(out.Squashed, tx.Squashes...)
			}
		}
	}
	text := "the pending stack is one transaction, " + id
	if len(out.Squashed) > 0 {
		text += " (it replaced " + strings.Join(out.Squashed, ", ") + ")"
	}
	return mcpText(text), out, nil
}
