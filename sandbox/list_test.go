package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

func TestListDirShowsWhatMayBeReadAndNoMore(t *testing.T) {
	ws := t.TempDir()
	for _, d := range []string{"src", "private"} {
		if err := os.Mkdir(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a.txt", "src/main.go", "src/.env"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	pol := policy.Default()
	pol.Rules = []policy.Rule{
		{Action: policy.Read, Target: "private", Decision: policy.Deny},
		{Action: policy.Read, Target: "**/.env", Decision: policy.Deny},
	}
	sb := newHost(t, ws, WithPolicy(pol))
	ctx := context.Background()

	names := func(dir string) []string {
		t.Helper()
		ents, err := sb.ListDir(ctx, dir)
		if err != nil {
			t.Fatalf("ListDir(%q): %v", dir, err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Path+":"+e.Type)
		}
		return out
	}
	// The root: its own state and a read-denied directory are left out.
	if got, want := names(""), []string{"a.txt:file", "out:symlink", "src:dir"}; !slices.Equal(got, want) {
		t.Errorf("root = %v, want %v", got, want)
	}
	if got, want := names("src"), []string{"src/main.go:file"}; !slices.Equal(got, want) {
		t.Errorf("src = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		dir  string
		want error
	}{
		{"private", ErrPolicyDenied},
		{".pulse", ErrPolicyDenied},
		{"..", pathguard.ErrOutside},
		{"out", pathguard.ErrOutside},
		{outside, pathguard.ErrOutside},
	} {
		if _, err := sb.ListDir(ctx, tc.dir); !errors.Is(err, tc.want) {
			t.Errorf("ListDir(%q) = %v, want %v", tc.dir, err, tc.want)
		}
	}
}

// TestListDirPendingView: ListDir shows what the next command sees — a
// directory that exists only as pending writes lists, a pending deletion
// is gone — and ListCommitted the workspace alone; List and ListDir
// check a directory where it resolves, so a link to a read-denied one
// lists nothing. On the namespace and Docker backends.
func TestListDirPendingView(t *testing.T) {
	for _, bk := range []struct {
		name string
		open func(*testing.T, string, ...Option) *Sandbox
	}{{"namespace", newIsolated}, {"docker", newDockerSandbox}} {
		t.Run(bk.name, func(t *testing.T) { listDirPendingView(t, bk.open) })
	}
}

func listDirPendingView(t *testing.T, open func(*testing.T, string, ...Option) *Sandbox) {
	ws := t.TempDir()
	for _, d := range []string{"private", "src"} {
		if err := os.Mkdir(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"gone.txt", "private/key.pem", "src/main.go"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("private", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{
		{Action: policy.Read, Target: "private", Decision: policy.Deny},
		{Action: policy.Read, Target: "private/**", Decision: policy.Deny},
	}, pol.Rules...)
	sb := open(t, ws, WithPolicy(pol))
	ctx := context.Background()
	if _, err := sb.Execute(ctx, Command{Shell: "rm gone.txt; mkdir -p newdir/sub && echo hello > newdir/sub/a.txt && echo y > src/new.go"}); err != nil {
		t.Fatal(err)
	}
	list := func(dir string, opts ...ListOption) ([]string, error) {
		t.Helper()
		ents, err := sb.ListDir(ctx, dir, opts...)
		var out []string
		for _, e := range ents {
			out = append(out, fmt.Sprintf("%s:%s:%d", e.Path, e.Type, e.Size))
		}
		return out, err
	}
	for _, tc := range []struct {
		dir       string
		committed bool
		want      []string
		err       error
	}{
		{dir: "", want: []string{"link:symlink:7", "newdir:dir:0", "src:dir:0"}},
		{dir: "newdir", want: []string{"newdir/sub:dir:0"}},
		{dir: "newdir/sub", want: []string{"newdir/sub/a.txt:file:6"}},
		{dir: "src", want: []string{"src/main.go:file:1", "src/new.go:file:2"}},
		{dir: "gone.txt", err: fs.ErrNotExist},
		{dir: "", committed: true, want: []string{"gone.txt:file:1", "link:symlink:7", "src:dir:0"}},
		{dir: "src", committed: true, want: []string{"src/main.go:file:1"}},
		{dir: "newdir", committed: true, err: fs.ErrNotExist},
		{dir: "link", err: ErrPolicyDenied},
		{dir: "link", committed: true, err: ErrPolicyDenied},
		{dir: "newdir/../..", err: pathguard.ErrOutside},
	} {
		var opts []ListOption
		if tc.committed {
			opts = append(opts, ListCommitted())
		}
		got, err := list(tc.dir, opts...)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("ListDir(%q, committed %v) = %v, %v; want %v", tc.dir, tc.committed, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ListDir(%q, committed %v) = %v, %v; want %v", tc.dir, tc.committed, got, err, tc.want)
		}
	}
	// List, the fs.DirEntry form, agrees, and refuses the link too.
	if ents, err := sb.List(ctx, "newdir/sub"); err != nil || !slices.Equal(names(ents), []string{"a.txt"}) {
		t.Errorf("List(newdir/sub) = %v, %v", names(ents), err)
	}
	if ents, err := sb.List(ctx, "link"); !errors.Is(err, ErrPolicyDenied) {
		t.Errorf("List(link) = %v, %v; want ErrPolicyDenied (it resolves to private)", names(ents), err)
	}
	// Nor does a path through the link tell what private holds.
	for _, p := range []string{"link/key.pem", "link/nope"} {
		if fi, err := sb.Stat(ctx, p); !errors.Is(err, ErrPolicyDenied) {
			t.Errorf("Stat(%s) = %v, %v; want ErrPolicyDenied", p, fi, err)
		}
		if _, err := sb.Remove(ctx, p); !errors.Is(err, ErrPolicyDenied) {
			t.Errorf("Remove(%s) = %v; want ErrPolicyDenied", p, err)
		}
	}
	// Through a link to a readable directory: refused, as a write
	// there is, not a removal of nothing.
	if err := os.Symlink("src", filepath.Join(ws, "srclink")); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Remove(ctx, "srclink/main.go"); err == nil {
		t.Error("Remove through a link of the workspace was staged")
	}
	if _, err := sb.Rename(ctx, "srclink/main.go", "main.go"); err == nil {
		t.Error("Rename through a link of the workspace was staged")
	}
	if fi, err := sb.Stat(ctx, "link"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("Stat(link) = %v, %v; want the link itself", fi, err)
	}
}
