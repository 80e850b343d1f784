package namespace

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"golang.org/x/sys/unix"
)

// TestReadOverlayEntries: the upper layer is read by name in open
// directories, with what each kind of entry means. A FIFO, new or made
// where a file was (the reader must not block on it, and reports it as
// one, with no content, and what it replaced as deleted: see
// backend.File), files and directories the
// command made unreadable (read, with the mode it left), an unchanged
// copy-up (not reported, also beneath a directory of the workspace), a
// changed one, a symlink replacing a lower file, a file under a lower
// symlink (never looked up through it), and a whiteout where one can be
// made.
func TestReadOverlayEntries(t *testing.T) {
	tmp := t.TempDir()
	lower, upper := filepath.Join(tmp, "lower"), filepath.Join(tmp, "upper")
	for _, d := range []string{lower, upper, filepath.Join(lower, "d"), filepath.Join(upper, "d"), filepath.Join(tmp, "elsewhere")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(lower, "same"), "same\n", 0o644)
	write(filepath.Join(upper, "same"), "same\n", 0o644)
	write(filepath.Join(lower, "d", "same"), "inner\n", 0o644)
	write(filepath.Join(upper, "d", "same"), "inner\n", 0o644)
	write(filepath.Join(lower, "changed"), "old\n", 0o644)
	write(filepath.Join(upper, "changed"), "new\n", 0o644)
	write(filepath.Join(lower, "was-file"), "file\n", 0o644)
	if err := os.Symlink("same", filepath.Join(upper, "was-file")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(upper, "locked"), "locked\n", 0o000)
	if err := os.Mkdir(filepath.Join(upper, "closed"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(upper, "closed", "in"), "in\n", 0o644)
	if err := os.Chmod(filepath.Join(upper, "closed"), 0o000); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"fifo", "was-file-now-fifo"} {
		if err := unix.Mkfifo(filepath.Join(upper, p), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(lower, "was-file-now-fifo"), "file\n", 0o644)
	// lower/via is a symlink to a directory outside holding "x": the
	// upper x beneath it is new, whatever the link leads to.
	write(filepath.Join(tmp, "elsewhere", "x"), "x\n", 0o644)
	if err := os.Symlink(filepath.Join(tmp, "elsewhere"), filepath.Join(lower, "via")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(upper, "via"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(upper, "via", "x"), "x\n", 0o644)
	write(filepath.Join(lower, "gone"), "bye\n", 0o644)
	whiteout := unix.Mknod(filepath.Join(upper, "gone"), unix.S_IFCHR, 0) == nil

	ov, err := readOverlay(upper, lower, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	modes := map[string]fs.FileMode{}
	for _, f := range ov.Files {
		got[f.Path] = string(f.Data)
		modes[f.Path] = f.Mode
	}
	want := map[string]string{
		"changed":           "new\n",
		"was-file":          "same",
		"locked":            "locked\n",
		"closed":            "",
		"closed/in":         "in\n",
		"via":               "",
		"via/x":             "x\n",
		"fifo":              "",
		"was-file-now-fifo": "",
	}
	for p, w := range want {
		if g, ok := got[p]; !ok || g != w {
			t.Errorf("%s: got %q (reported %v), want %q", p, g, ok, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s reported, want it left out", p)
		}
	}
	if modes["locked"] != 0 {
		t.Errorf("locked: mode %v, want the 000 the command left", modes["locked"])
	}
	if modes["closed"] != fs.ModeDir {
		t.Errorf("closed: mode %v, want d---------", modes["closed"])
	}
	for _, p := range []string{"fifo", "was-file-now-fifo"} {
		if modes[p] != fs.ModeNamedPipe|0o640 {
			t.Errorf("%s: mode %v, want a named pipe, rw-r-----", p, modes[p])
		}
	}
	if modes["was-file"] != fs.ModeSymlink {
		t.Errorf("was-file: mode %v, want a symlink", modes["was-file"])
	}
	wantDeleted := []string{"via", "was-file-now-fifo"}
	if whiteout {
		wantDeleted = append(wantDeleted, "gone")
	}
	deleted := map[string]bool{}
	for _, d := range ov.Deleted {
		deleted[d] = true
	}
	for _, d := range wantDeleted {
		if !deleted[d] {
			t.Errorf("%s not reported deleted (deleted: %q)", d, ov.Deleted)
		}
	}
	if len(ov.Deleted) != len(wantDeleted) {
		t.Errorf("deleted %q, want %q", ov.Deleted, wantDeleted)
	}
}

// readOverlay turns the overlayfs upper directory into an Overlay. lower is
// the workspace the command saw. Nothing is followed: symlinks in upper or
// lower are read as links, and lower is only consulted through directories
// that are real directories at every level.
func readOverlay(upper, lower string, hidden hiddenSet) (*backend.Overlay, error) {
	return readOverlayOn(upper, lowerView{dir: lower}, hidden)
}

// readOverlayOn is readOverlay with the pending view the command saw
// over the workspace (lowerView).
func readOverlayOn(upper string, lower lowerView, hidden hiddenSet) (*backend.Overlay, error) {
	return readOverlayKeep(upper, lower, hidden, nil)
}
