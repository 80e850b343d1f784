package sandbox

import (
	"context"
	"errors"
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
