package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

// The examples run on the host backend, which runs everywhere the tests
// do, so that their output is checked on every machine. It isolates
// nothing and writes in place: a program handing untrusted commands to
// the sandbox leaves the backend to New's choice (remote, Docker,
// namespaces), which captures every write into a pending transaction.
// The host cannot deny the network or hide secrets on the disk, which the
// default policy asks for: the examples accept that by name
// (UnsafeNetwork, UnsafeSecrets), or the host would refuse to run them.

// newWorkspace makes a throwaway workspace holding a README.
func newWorkspace() string {
	ws, err := os.MkdirTemp("", "pulse-example-")
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "README.md"), []byte("# demo\n"), 0o644); err != nil {
		panic(err)
	}
	return ws
}

// An agent stages a change, a person previews it, and it is committed.
func Example() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)

	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	res, err := sb.Execute(ctx, sandbox.Command{Shell: "cat README.md"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("exit %d: %s", res.ExitCode, res.Stdout)

	tx, err := sb.BeginTx(ctx, "say hello")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := tx.Write(ctx, "hello.txt", []byte("hello\n"), 0o644); err != nil {
		fmt.Println(err)
		return
	}
	diff, err := tx.Diff(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(diff)
	committed, err := tx.Commit(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("committed", committed)
	// Output:
	// exit 0: # demo
	// diff --git a/hello.txt b/hello.txt
	// new file mode 100644
	// --- /dev/null
	// +++ b/hello.txt
	// @@ -0,0 +1 @@
	// +hello
	// committed [hello.txt]
}

// New opens a sandbox on a workspace; here on the host backend, named
// explicitly (the host needs the unsafe opt-in).
func ExampleNew() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)

	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		// With no backend available: errors.Is(err, sandbox.ErrUnavailable).
		fmt.Println(err)
		return
	}
	defer sb.Close()
	fmt.Println(sb.Backend().Name(), sb.Workspace() == ws)
	// Output:
	// host true
}

// Execute runs a command and returns how it ended with its output. On the
// host backend it writes in place, so the Result lists what it changed; an
// isolating backend would instead leave the write in res.Transaction for
// review.
func ExampleSandbox_Execute() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	res, err := sb.Execute(ctx, sandbox.Command{Shell: "echo built > out.txt; echo done; exit 3"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("exit %d, stdout %q, in place %v, changed %v\n", res.ExitCode, res.Stdout, res.InPlace, res.Changed)
	// Output:
	// exit 3, stdout "done\n", in place true, changed [out.txt]
}

// Diff shows a pending transaction as a unified diff before anything
// lands; Discard drops it.
func ExampleTx_Diff() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	tx, err := sb.BeginTx(ctx, "retitle")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := tx.Write(ctx, "README.md", []byte("# pulse demo\n"), 0o644); err != nil {
		fmt.Println(err)
		return
	}
	diff, err := tx.Diff(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(diff)
	if err := tx.Discard(ctx); err != nil {
		fmt.Println(err)
		return
	}
	data, _ := os.ReadFile(filepath.Join(ws, "README.md"))
	fmt.Printf("on disk: %s", data)
	// Output:
	// diff --git a/README.md b/README.md
	// --- a/README.md
	// +++ b/README.md
	// @@ -1 +1 @@
	// -# demo
	// +# pulse demo
	// on disk: # demo
}

// Commit applies a pending transaction to the workspace, crash-safe, after
// checking each change against the policy again; a
// file changed on disk since it was staged would fail it with
// ErrConflict instead of being overwritten.
func ExampleTx_Commit() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	tx, err := sb.BeginTx(ctx, "notes")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := tx.Write(ctx, "NOTES.md", []byte("staged, then committed\n"), 0o644); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := os.Stat(filepath.Join(ws, "NOTES.md")); errors.Is(err, os.ErrNotExist) {
		fmt.Println("not on disk while pending")
	}
	committed, err := tx.Commit(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	data, _ := os.ReadFile(filepath.Join(ws, "NOTES.md"))
	fmt.Printf("committed %v: %s", committed, data)
	// Output:
	// not on disk while pending
	// committed [NOTES.md]: staged, then committed
}

// A policy read from YAML binds every call: a denied command starts no
// process and a denied write is never staged; both are audited.
func ExampleWithPolicy() {
	pol, err := policy.Parse([]byte(`
version: 1
defaults:
  shell: allow
rules:
  - {action: shell, target: "curl *", decision: deny}
  - {action: write, target: ".env", decision: deny}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithPolicy(pol),
		sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	res, err := sb.Execute(ctx, sandbox.Command{Shell: "echo allowed"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(res.Stdout)
	_, err = sb.Execute(ctx, sandbox.Command{Args: []string{"curl", "https://example.com"}})
	fmt.Println("curl denied:", errors.Is(err, sandbox.ErrPolicyDenied))
	tx, err := sb.BeginTx(ctx, "secrets")
	if err != nil {
		fmt.Println(err)
		return
	}
	err = tx.Write(ctx, ".env", []byte("TOKEN=x\n"), 0o600)
	fmt.Println(".env denied:", errors.Is(err, sandbox.ErrPolicyDenied))
	// Output:
	// allowed
	// curl denied: true
	// .env denied: true
}

// A background process's output is read as it stands (OutputSnapshot)
// rather than followed (Output): a poller gets what is there and whether
// more can come.
func ExampleProcess_OutputSnapshot() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	p, err := sb.Start(ctx, sandbox.Command{Shell: "echo building; echo done"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := p.Wait(ctx); err != nil {
		fmt.Println(err)
		return
	}
	out, ended, err := p.OutputSnapshot(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%sended: %v\n", out, ended)
	// Polling goes on from the offset reached.
	more, _, _ := p.OutputSnapshot(int64(len(out)))
	fmt.Printf("more: %q\n", more)
	// Output:
	// building
	// done
	// ended: true
	// more: ""
}

// cancelOnWrite is a writer that calls cancel when written to.
type cancelOnWrite context.CancelFunc

func (c cancelOnWrite) Write(p []byte) (int, error) { c(); return len(p), nil }

// A command cancelled through its context still returns its Result with
// the context's error: the output printed until then, how it ended, and
// its execution id for the audit log.
func ExampleSandbox_Execute_cancel() {
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(context.Background(), ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The line on stderr comes after stdout's: the caller cancels then.
	res, err := sb.Execute(ctx, sandbox.Command{Shell: "echo compiling; echo stuck >&2; sleep 60", Stderr: cancelOnWrite(cancel)})
	fmt.Println(errors.Is(err, context.Canceled), res.Termination, res.ExecutionID != "")
	fmt.Print(res.Stdout)
	// Output:
	// true cancelled true
	// compiling
}

// ListDir shows the workspace as the next command sees it: a directory a
// command made exists, although nothing is committed yet. ListCommitted
// shows the workspace as it is on disk. (Not run: it needs an isolating
// backend, which captures writes, where the host backend writes in place.)
func ExampleSandbox_ListDir() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, "/path/to/repo")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()
	if _, err := sb.Execute(ctx, sandbox.Command{Shell: "mkdir -p build && echo ok > build/status"}); err != nil {
		fmt.Println(err)
		return
	}
	pending, _ := sb.ListDir(ctx, "build")
	for _, e := range pending {
		fmt.Println(e.Path, e.Type, e.Size) // build/status file 3
	}
	if _, err := sb.ListDir(ctx, "build", sandbox.ListCommitted()); errors.Is(err, fs.ErrNotExist) {
		fmt.Println("build is not committed yet")
	}
}

// SafeGit commits as the identity given: the sandbox's environment holds
// no git configuration of the caller's. (Not run: it needs git and an
// isolating backend.)
func ExampleSafeGit_Commit() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, "/path/to/repo", sandbox.WithPolicy(policy.Default()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()
	g := sb.Git()
	if _, err := g.Add(ctx, "."); err != nil {
		fmt.Println(err)
		return
	}
	res, err := g.Commit(ctx, "fix the build",
		sandbox.GitAuthor("Build Agent", "agent@example.com"),
		sandbox.GitCommitter("Ada Reviewer", "ada@example.com"))
	if err != nil {
		fmt.Println(err)
		return
	}
	if res.ExitCode != 0 {
		// git refused: nothing was staged; res.Stderr says why.
		fmt.Print(res.Stderr)
		return
	}
	fmt.Println("pending review:", res.Transaction)
}

// WriteFiles stages a batch of edits as one transaction: one change to
// review, commit or discard.
func ExampleSandbox_WriteFiles() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	id, err := sb.WriteFiles(ctx, []sandbox.FileWrite{
		{Path: "cmd/main.go", Data: []byte("package main\n")},
		{Path: "cmd/main_test.go", Data: []byte("package main\n")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	tx, err := sb.OpenTx(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range tx.Changes() {
		fmt.Println(c.Kind, c.Path)
	}
	// A refused path refuses the whole batch.
	_, err = sb.WriteFiles(ctx, []sandbox.FileWrite{{Path: "ok.txt"}, {Path: "../outside.txt"}})
	fmt.Println(errors.Is(err, sandbox.ErrInvalidCommand))
	// Output:
	// mkdir cmd
	// write cmd/main.go
	// write cmd/main_test.go
	// true
}

// Rename, Remove and Mkdir stage a transaction each; nothing reaches the
// workspace until it is committed.
func ExampleSandbox_Rename() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	if _, err := sb.Mkdir(ctx, "docs", 0o755); err != nil {
		fmt.Println(err)
		return
	}
	id, err := sb.Rename(ctx, "README.md", "docs/README.md")
	if err != nil {
		fmt.Println(err)
		return
	}
	tx, err := sb.OpenTx(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range tx.Changes() {
		fmt.Println(c.Kind, c.Path)
	}
	if _, err := sb.Remove(ctx, "missing.txt"); errors.Is(err, fs.ErrNotExist) {
		fmt.Println("missing.txt: not there")
	}
	// Output:
	// delete README.md
	// mkdir docs
	// write docs/README.md
	// missing.txt: not there
}

// A policy exposes a range of ports for a server that picks its own;
// a port outside every range is refused with an *ExposeError.
func ExampleSandbox_Expose() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	pol, err := policy.Parse([]byte("network: {expose: [3000-3999]}"))
	if err != nil {
		fmt.Println(err)
		return
	}
	sb, err := sandbox.New(ctx, ws, sandbox.WithPolicy(pol),
		sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	addr, err := sb.Expose(ctx, 3417) // a dev server's port, inside the range
	fmt.Println(err == nil && addr != "")
	var ee *sandbox.ExposeError
	_, err = sb.Expose(ctx, 5432)
	fmt.Println(errors.As(err, &ee), ee.Port, errors.Is(err, sandbox.ErrPortNotExposed))
	// Output:
	// true
	// true 5432 true
}

// Mkdir stages a directory, its missing parents with it; a path already
// there is fs.ErrExist.
func ExampleSandbox_Mkdir() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	id, err := sb.Mkdir(ctx, "internal/app", 0o755)
	if err != nil {
		fmt.Println(err)
		return
	}
	tx, err := sb.OpenTx(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range tx.Changes() {
		fmt.Println(c.Kind, c.Path)
	}
	_, err = sb.Mkdir(ctx, "README.md", 0)
	fmt.Println(errors.Is(err, fs.ErrExist))
	// Output:
	// mkdir internal
	// mkdir internal/app
	// true
}

// Remove stages a removal; the delete policy decides, and a refusal
// stages nothing.
func ExampleSandbox_Remove() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{{Action: policy.Delete, Target: "README.md", Decision: policy.Deny}}, pol.Rules...)
	sb, err := sandbox.New(ctx, ws, sandbox.WithPolicy(pol), sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()

	_, err = sb.Remove(ctx, "README.md")
	fmt.Println(errors.Is(err, sandbox.ErrPolicyDenied))
	pending, err := sb.Transactions(ctx)
	fmt.Println(len(pending), err)
	// Output:
	// true
	// 0 <nil>
}
