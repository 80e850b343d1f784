package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// newDockerSandbox opens a sandbox on the Docker backend, or skips when no
// engine answers or the image is missing — unless PULSE_REQUIRE_DOCKER=1,
// where that is a failure (testenv.MustHaveDocker).
func newDockerSandbox(t *testing.T, ws string, opts ...Option) *Sandbox {
	t.Helper()
	b, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	testenv.MustHaveDocker(t, b.Probe)
	opts = append([]Option{withGetenv(noEnv), WithBackend(b)}, opts...)
	sb, err := New(context.Background(), ws, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

// A command that plants a hook or git config is staged, but auto-commit
// holds it for a person; git's own data beside it is ordinary.
func TestAutoCommitNeverAppliesWhatGitRunsOnTheHost(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	writeFile(t, ws, ".git/HEAD", "ref: refs/heads/main\n")
	if err := os.Symlink(".git/hooks", filepath.Join(ws, "hk")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(ws, ".git/hooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{
		{Path: ".git/hooks/pre-commit", Mode: 0o755, Data: []byte("#!/bin/sh\ntouch /tmp/pwned\n")},
		{Path: ".git/config", Mode: 0o644, Data: []byte("[core]\n\tfsmonitor = touch /tmp/pwned\n")},
		{Path: ".git/objects/ab/cdef", Mode: 0o444, Data: []byte("blob")},
		{Path: "src/a.txt", Mode: 0o644, Data: []byte("a\n")},
	}}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := sb.Execute(ctx, Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.CommitErr, ErrRunsOnHost) || res.Transaction == "" || len(res.Committed) != 0 {
		t.Fatalf("CommitErr = %v, tx %q, committed %v: want the transaction held with ErrRunsOnHost", res.CommitErr, res.Transaction, res.Committed)
	}
	slices.Sort(res.RunsOnHost)
	if want := []string{".git/config", ".git/hooks/pre-commit"}; !slices.Equal(res.RunsOnHost, want) {
		t.Fatalf("RunsOnHost = %v, want %v", res.RunsOnHost, want)
	}
	for _, p := range []string{".git/hooks/pre-commit", ".git/config", "src/a.txt"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
			t.Errorf("%s was applied without a person", p)
		}
	}

	// Through a link the workspace already has, the hook is not even
	// staged: cowfs refuses a path beneath a symlink of the workspace
	// (it never replaces a user's link implicitly), so nothing reaches
	// .git/hooks and the link stays.
	be.ov = &backend.Overlay{Files: []backend.File{{Path: "hk/post-checkout", Mode: 0o755, Data: []byte("#!/bin/sh\n")}}}
	res2, err := sb.Execute(ctx, Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Refused) != 1 || res2.Refused[0].Path != "hk/post-checkout" || len(res2.Committed) != 0 {
		t.Fatalf("through a symlink: Refused = %v, Committed = %v", res2.Refused, res2.Committed)
	}
	if l, err := os.Readlink(filepath.Join(ws, "hk")); err != nil || l != ".git/hooks" {
		t.Fatalf("hk is now %q, %v", l, err)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git/hooks/post-checkout")); err == nil {
		t.Fatal("a hook was planted through a symlink")
	}

	// Code committing through the SDK (an agent's harness, the MCP
	// commit tool) is not a person: refused without an Approver.
	tx, err := sb.OpenTx(ctx, res.Transaction)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx); !errors.Is(err, ErrRunsOnHost) {
		t.Fatalf("SDK Commit of a hook: err = %v, want ErrRunsOnHost", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git/hooks/pre-commit")); err == nil {
		t.Fatal("the SDK committed a hook without a person")
	}
	evs := verifyAudit(t, sb)
	// A person's review (pulse cow commit, pulse review) applies it.
	r, err := OpenReview(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Commit(ctx, res.Transaction); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if got := readFile(t, ws, ".git/hooks/pre-commit"); got != "#!/bin/sh\ntouch /tmp/pwned\n" {
		t.Fatalf("after a person's commit the hook is %q", got)
	}
	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Action == "commit" && e.Decision == "deny" && e.Reason == "runs_on_host"
	}) {
		t.Fatal("the hold is not audited")
	}
	if !hasEvent(evs, func(e audit.Event) bool { return e.Target == ".git/config" && e.Reason == "runs_on_host" }) {
		t.Fatal("the staged config is not marked in the audit log")
	}
}

func gitCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	c := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	c.Dir = dir
	c.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// git commit inside the sandbox is auto-committed like any write; a hook
// and an fsmonitor planted beside it are held, and the host's next git
// command runs neither.
func TestIsolatedGitCommitAppliesButPlantedHooksAreHeld(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git on the host")
	}
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	gitCmd(t, ws, "init", "-q", "-b", "main")
	writeFile(t, ws, "a.txt", "one\n")
	gitCmd(t, ws, "add", "a.txt")
	gitCmd(t, ws, "commit", "-qm", "init")
	sb := newIsolated(t, ws, WithAutoCommit())
	ctx := context.Background()

	res, err := sb.Execute(ctx, Command{Shell: "echo two >> a.txt && git add a.txt && " +
		"git -c user.name=s -c user.email=s@example.com commit -qm two"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("git commit in the sandbox: %+v %v", res, err)
	}
	if res.CommitErr != nil || len(res.RunsOnHost) != 0 {
		t.Fatalf("an ordinary git commit was held: %v (runs on host: %v)", res.CommitErr, res.RunsOnHost)
	}
	if log := gitCmd(t, ws, "log", "--format=%s"); log != "two\ninit\n" {
		t.Fatalf("host git log = %q", log)
	}

	res, err = sb.Execute(ctx, Command{Shell: `printf '#!/bin/sh\ntouch "$PWD/hooked"\n' > .git/hooks/post-checkout &&
		chmod +x .git/hooks/post-checkout && git config core.fsmonitor 'touch "$PWD/monitored"; false' &&
		git config alias.st '!touch aliased'`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("planting: %+v %v", res, err)
	}
	if !errors.Is(res.CommitErr, ErrRunsOnHost) || !slices.Contains(res.RunsOnHost, ".git/config") ||
		!slices.Contains(res.RunsOnHost, ".git/hooks/post-checkout") {
		t.Fatalf("CommitErr = %v, RunsOnHost = %v: want the hook and the config held", res.CommitErr, res.RunsOnHost)
	}
	gitCmd(t, ws, "status", "--short")
	gitCmd(t, ws, "checkout", "-q", "-b", "next")
	for _, f := range []string{"hooked", "monitored", "aliased"} {
		if _, err := os.Lstat(filepath.Join(ws, f)); err == nil {
			t.Errorf("host git ran code the sandbox planted (%s exists)", f)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git/hooks/post-checkout")); err == nil {
		t.Errorf("the hook reached the workspace")
	}
}

// On Docker the same: writes to .git/hooks and .git/config are held.
func TestDockerPlantedGitConfigIsHeld(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	writeFile(t, ws, ".git/HEAD", "ref: refs/heads/main\n")
	writeFile(t, ws, ".git/config", "[core]\n\tbare = false\n")
	sb := newDockerSandbox(t, ws, WithAutoCommit())
	res, err := sb.Execute(context.Background(), Command{Shell: `mkdir -p .git/hooks && echo '#!/bin/sh' > .git/hooks/pre-commit &&
		printf '[core]\n\tfsmonitor = touch pwned\n' >> .git/config && echo x > x.txt`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	if !errors.Is(res.CommitErr, ErrRunsOnHost) || len(res.Committed) != 0 {
		t.Fatalf("CommitErr = %v, committed %v: want the transaction held", res.CommitErr, res.Committed)
	}
	if got := readFile(t, ws, ".git/config"); got != "[core]\n\tbare = false\n" {
		t.Fatalf(".git/config changed without a person: %q", got)
	}
}

// An Approver — a person's hook — may let the SDK commit such a path.
func TestSDKCommitOfAHookAsksTheApprover(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{{Path: ".git/hooks/post-merge", Mode: 0o755, Data: []byte("#!/bin/sh\n")}}}}
	var asked []string
	answer := true // staging asks too (the default policy asks about writes)
	sb, err := New(context.Background(), ws, WithBackend(be), WithApprover(func(_ context.Context, a policy.Action, target string) (bool, error) {
		asked = append(asked, string(a)+" "+target)
		return answer, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	res, err := sb.Execute(ctx, Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := sb.OpenTx(ctx, res.Transaction)
	if err != nil {
		t.Fatal(err)
	}
	asked, answer = nil, false
	if _, err := tx.Commit(ctx); !errors.Is(err, ErrRunsOnHost) || !slices.Equal(asked, []string{"write .git/hooks/post-merge"}) {
		t.Fatalf("refused approval: err = %v, asked %q", err, asked)
	}
	// Committing the whole stack asks the same, and applies nothing when
	// refused.
	asked = nil
	if _, err := sb.CommitAll(ctx); !errors.Is(err, ErrRunsOnHost) || !slices.Equal(asked, []string{"write .git/hooks/post-merge"}) {
		t.Fatalf("CommitAll, refused approval: err = %v, asked %q", err, asked)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git/hooks/post-merge")); err == nil {
		t.Fatal("CommitAll committed a hook the approver refused")
	}
	answer = true
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatalf("approved: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git/hooks/post-merge")); err != nil {
		t.Fatalf("the approved hook was not committed: %v", err)
	}
}
