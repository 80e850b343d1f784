package namespace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestEscapeBindCoversWorkspace: an extra bind at, above or below the
// workspace would cover its overlay, showing the hidden .pulse directory
// and, read-write, letting the command write the real workspace past the
// captured upper layer. Exec refuses such a bind, naming it; an unrelated
// bind still works, and a bind that covers the probe's own temporary
// workspace does not fail the probe.
func TestEscapeBindCoversWorkspace(t *testing.T) {
	newBackend(t) // skips unless namespaces work here
	parent := t.TempDir()
	ws := filepath.Join(parent, "ws")
	if err := os.MkdirAll(filepath.Join(ws, ".pulse"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, ".pulse", "state"), []byte("COWFS-STATE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A symlink outside the workspace to its parent, and one inside it
	// to a directory outside, so that only resolving tells.
	elsewhere := t.TempDir()
	linkToParent := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(parent, linkToParent); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}

	script := `cat .pulse/state 2>/dev/null; echo direct > "$WS/written" 2>/dev/null; true`
	for _, tc := range []struct {
		name string
		opt  Option
		dir  string
	}{
		{"read-only parent", WithReadOnlyBind(parent), parent},
		{"read-write parent", WithReadWriteBind(parent), parent},
		{"read-only workspace", WithReadOnlyBind(ws), ws},
		{"read-write workspace", WithReadWriteBind(ws), ws},
		{"read-write below the workspace", WithReadWriteBind(filepath.Join(ws, "sub")), filepath.Join(ws, "sub")},
		{"read-only symlink to the parent", WithReadOnlyBind(linkToParent), linkToParent},
		{"read-write target inside the workspace", WithReadWriteBind(filepath.Join(ws, "out")), filepath.Join(ws, "out")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, tc.opt)
			var out strings.Builder
			res, err := b.Exec(context.Background(), &backend.Request{
				Workspace: ws, Shell: script, Env: map[string]string{"WS": ws},
				Stdout: &out, Stderr: &out, Limits: policyTimeout(30e9),
			})
			if !errors.Is(err, backend.ErrInvalidRequest) {
				t.Errorf("Exec with a bind of %s: %+v, %v (output %q); want ErrInvalidRequest", tc.dir, res, err, out.String())
			} else if !strings.Contains(err.Error(), tc.dir) {
				t.Errorf("error %q does not name the bind %s", err, tc.dir)
			}
			if _, err := os.Stat(filepath.Join(ws, "written")); err == nil {
				os.Remove(filepath.Join(ws, "written"))
				t.Errorf("the command wrote the real workspace through a bind of %s", tc.dir)
			}
		})
	}

	t.Run("unrelated binds", func(t *testing.T) {
		ro, rw := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(ro, "f"), []byte("shown\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		b := newBackend(t, WithReadOnlyBind(ro), WithReadWriteBind(rw))
		res, out, errs := runCmd(t, b, &backend.Request{Workspace: ws,
			Shell: `cat "$RO/f" && ! touch "$RO/x" 2>/dev/null && echo shared > "$RW/g"`, Env: map[string]string{"RO": ro, "RW": rw}})
		if res.ExitCode != 0 || out != "shown\n" {
			t.Fatalf("exit %d out %q err %q", res.ExitCode, out, errs)
		}
		if got, err := os.ReadFile(filepath.Join(rw, "g")); err != nil || string(got) != "shared\n" {
			t.Fatalf("read-write bind: %q, %v", got, err)
		}
	})

	t.Run("probe under a bind", func(t *testing.T) {
		// The probe makes its workspace in the temporary directory, which
		// the caller may well bind.
		tmp := t.TempDir()
		t.Setenv("TMPDIR", tmp)
		b, err := New(WithStateDir(filepath.Join(t.TempDir(), "state")), WithReadWriteBind(tmp))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.Probe(context.Background()); err != nil {
			t.Fatalf("Probe with a bind of the temporary directory: %v", err)
		}
	})
}
