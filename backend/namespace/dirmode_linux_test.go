package namespace

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestOverlayDirectoryModes: a chmod of a directory the workspace has is
// a change the command made (it used to be left out: the directory was
// there before, so nothing was recorded), a directory made setgid keeps
// the bit, and a setgid directory that was merely copied up (a file
// written in it) is no change.
func TestOverlayDirectoryModes(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "open/a"), "a\n")
	writeFile(t, filepath.Join(ws, "shared/a"), "a\n")
	if err := os.Chmod(filepath.Join(ws, "shared"), 0o2775); err != nil {
		t.Fatal(err)
	}
	res, _, errs := runCmd(t, b, &backend.Request{Workspace: ws,
		Shell: "set -e; chmod 700 open; mkdir -m 2770 team; echo b > shared/b"})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	got := map[string]fs.FileMode{}
	for _, f := range res.Overlay.Files {
		got[f.Path] = f.Mode
	}
	if m, ok := got["open"]; !ok || m != fs.ModeDir|0o700 {
		t.Errorf("chmod 700 of an existing directory: %v (recorded %v), want %v", m, ok, fs.ModeDir|0o700)
	}
	if m := got["team"]; m != fs.ModeDir|fs.ModeSetgid|0o770 {
		t.Errorf("mkdir -m 2770: %v, want %v", m, fs.ModeDir|fs.ModeSetgid|0o770)
	}
	if m, ok := got["shared"]; ok {
		t.Errorf("a copied-up setgid directory is recorded as a change: %v", m)
	}
	if _, ok := got["shared/b"]; !ok {
		t.Errorf("the file written in the setgid directory is missing: %v", got)
	}
}
