package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// TestFilesAPIChanges: WriteFiles, Mkdir, Remove and Rename stage one
// transaction each, through the pending view, under the checks a
// command's write passes — denied paths, traversal, links out of the
// workspace, the sandbox's own state, secrets, the file size limit — and
// a refused call stages nothing; committed, the workspace ends as the
// view showed. On the namespace and Docker backends.
func TestFilesAPIChanges(t *testing.T) {
	for _, bk := range []struct {
		name string
		open func(*testing.T, string, ...Option) *Sandbox
	}{{"namespace", newIsolated}, {"docker", newDockerSandbox}} {
		t.Run(bk.name, func(t *testing.T) { filesAPIChanges(t, bk.open) })
	}
}

func filesAPIChanges(t *testing.T, open func(*testing.T, string, ...Option) *Sandbox) {
	ws := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"dir/sub", "locked", "private"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{"keep.txt": "keep\n", "dir/a.txt": "a\n", "dir/sub/b.txt": "b\n",
		"locked/x": "x\n", "private/key": "k\n"} {
		writeFile(t, ws, name, data)
	}
	const secret = "sekret-value-123456"
	writeFile(t, ws, "creds.txt", "t="+secret+"\n")
	writeFile(t, ws, "big.bin", string(make([]byte, 2<<10)))
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{
		{Action: policy.Write, Target: "locked/**", Decision: policy.Deny},
		{Action: policy.Delete, Target: "locked/**", Decision: policy.Deny},
		{Action: policy.Read, Target: "private", Decision: policy.Deny},
		{Action: policy.Read, Target: "private/**", Decision: policy.Deny},
	}, pol.Rules...)
	sb := open(t, ws, WithPolicy(pol), WithLimits(policy.ResourceLimits{FileSizeBytes: 1 << 10}),
		WithSecrets([]secrets.Secret{{Name: "TOKEN", Value: secret}}))
	ctx := context.Background()
	count := func() int {
		t.Helper()
		txs, err := sb.Transactions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(txs)
	}

	// A batch is one transaction.
	id, err := sb.WriteFiles(ctx, []FileWrite{{Path: "src/a.go", Data: []byte("package a\n")}, {Path: "src/b.go", Data: []byte("package b\n"), Mode: 0o600}})
	if err != nil || id == "" {
		t.Fatalf("WriteFiles = %q, %v", id, err)
	}
	tx, err := sb.OpenTx(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range tx.Changes() {
		paths = append(paths, c.Path)
	}
	if !slices.Contains(paths, "src/a.go") || !slices.Contains(paths, "src/b.go") {
		t.Errorf("the batch's transaction holds %v", paths)
	}
	n := count()

	// Refusals stage nothing, wherever in the batch they come.
	big := make([]byte, 2<<10)
	for _, tc := range []struct {
		name  string
		files []FileWrite
		want  error
	}{
		{"write-denied", []FileWrite{{Path: "ok.txt"}, {Path: "locked/y"}}, ErrPolicyDenied},
		{"dotdot", []FileWrite{{Path: "ok.txt"}, {Path: "../escape.txt"}}, ErrInvalidCommand},
		{"dotdot-inside", []FileWrite{{Path: "dir/../../escape.txt"}}, ErrInvalidCommand},
		{"absolute-outside", []FileWrite{{Path: filepath.Join(outside, "abs.txt")}}, ErrInvalidCommand},
		{"own-state", []FileWrite{{Path: ".pulse/x"}}, ErrPolicyDenied},
		{"secret", []FileWrite{{Path: "ok.txt"}, {Path: "leak.txt", Data: []byte("t=" + secret)}}, ErrSecretInContent},
		{"too-big", []FileWrite{{Path: "ok.txt"}, {Path: "big.bin", Data: big}}, ErrLimitExceeded},
		{"empty", nil, ErrInvalidCommand},
	} {
		if _, err := sb.WriteFiles(ctx, tc.files); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	// Through a link that leads out of the workspace: refused (by cowfs,
	// which stages nothing through a workspace link).
	if _, err := sb.WriteFiles(ctx, []FileWrite{{Path: "ok.txt"}, {Path: "out/evil.txt"}}); err == nil {
		t.Error("a write through a link out of the workspace was staged")
	}
	if _, err := sb.WriteFile(ctx, "out/evil.txt", []byte("x"), 0o644); err == nil {
		t.Error("WriteFile through a link out of the workspace was staged")
	}
	if got := count(); got != n {
		t.Errorf("refused batches left %d transactions, want %d", got, n)
	}
	if _, err := sb.Stat(ctx, "ok.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ok.txt of a refused batch: %v", err)
	}

	// Mkdir.
	if _, err := sb.Mkdir(ctx, "made/deep", 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := sb.Stat(ctx, "made/deep"); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("Stat(made/deep) = %v, %v", fi, err)
	}
	for _, tc := range []struct {
		p    string
		want error
	}{{"dir", fs.ErrExist}, {"src/a.go", fs.ErrExist}, {"locked/new", ErrPolicyDenied}, {"../up", ErrInvalidCommand}, {".pulse/d", ErrPolicyDenied}} {
		if _, err := sb.Mkdir(ctx, tc.p, 0); !errors.Is(err, tc.want) {
			t.Errorf("Mkdir(%s) = %v, want %v", tc.p, err, tc.want)
		}
	}

	// Remove: a workspace file, and a file only the stack holds.
	for _, p := range []string{"keep.txt", "src/a.go"} {
		if _, err := sb.Remove(ctx, p); err != nil {
			t.Fatalf("Remove(%s): %v", p, err)
		}
		if _, err := sb.Stat(ctx, p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after Remove(%s), Stat = %v", p, err)
		}
	}
	if readFile(t, ws, "keep.txt") != "keep\n" {
		t.Error("Remove reached the workspace before a commit")
	}
	for _, tc := range []struct {
		p    string
		want error
	}{{"nope", fs.ErrNotExist}, {"keep.txt", fs.ErrNotExist}, {"locked/x", ErrPolicyDenied}, {"locked", ErrPolicyDenied},
		{"private/key", ErrPolicyDenied}, {"../x", ErrInvalidCommand}, {".", ErrInvalidCommand}} {
		if _, err := sb.Remove(ctx, tc.p); !errors.Is(err, tc.want) {
			t.Errorf("Remove(%s) = %v, want %v", tc.p, err, tc.want)
		}
	}

	// Rename: a directory of the workspace, a file only the stack holds.
	if _, err := sb.Rename(ctx, "dir", "moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Rename(ctx, "src/b.go", "src/c.go"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"moved/a.txt": "a\n", "moved/sub/b.txt": "b\n", "src/c.go": "package b\n"} {
		if got, err := sb.ReadFile(ctx, name); err != nil || string(got) != want {
			t.Errorf("after Rename, %s = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, p := range []string{"dir", "src/b.go"} {
		if _, err := sb.Stat(ctx, p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after Rename, Stat(%s) = %v", p, err)
		}
	}
	if fi, err := sb.Stat(ctx, "src/c.go"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("renamed file mode: %v, %v", fi, err)
	}
	for _, tc := range []struct {
		from, to string
		want     error
	}{
		{"locked/x", "free.txt", ErrPolicyDenied}, // delete denied
		{"src/c.go", "locked/z", ErrPolicyDenied}, // write denied
		{"private", "pub", ErrPolicyDenied},       // read denied
		{"src/c.go", "moved/a.txt", fs.ErrExist},
		{"moved", "moved/inner", ErrInvalidCommand},
		{"src/c.go", "../c.go", ErrInvalidCommand},
		{"nope", "x", fs.ErrNotExist},
		{"creds.txt", "creds2.txt", ErrSecretInContent}, // read as staged: the secret is refused
		{"big.bin", "big2.bin", ErrLimitExceeded},       // over file_size_bytes
	} {
		if _, err := sb.Rename(ctx, tc.from, tc.to); !errors.Is(err, tc.want) {
			t.Errorf("Rename(%s, %s) = %v, want %v", tc.from, tc.to, err, tc.want)
		}
	}
	ws2 := t.TempDir()
	if _, err := sb.Rename(ctx, "src/c.go", filepath.Join(ws2, "c.go")); !errors.Is(err, ErrInvalidCommand) {
		t.Errorf("Rename out of the workspace = %v, want ErrInvalidCommand", err)
	}

	// Committed, the workspace is what the view showed.
	if _, err := sb.CommitAll(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"moved/a.txt": "a\n", "moved/sub/b.txt": "b\n", "src/c.go": "package b\n"} {
		if got := readFile(t, ws, name); got != want {
			t.Errorf("committed %s = %q, want %q", name, got, want)
		}
	}
	for _, p := range []string{"dir", "keep.txt", "src/a.go", "src/b.go"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("committed: %s still there (%v)", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(ws, "made/deep")); err != nil || !fi.IsDir() {
		t.Errorf("committed made/deep: %v, %v", fi, err)
	}
	if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
		t.Errorf("outside the workspace: %v, %v", ents, err)
	}
	if readFile(t, ws, "locked/x") != "x\n" || readFile(t, ws, "private/key") != "k\n" {
		t.Error("a protected file changed")
	}
}
