//go:build linux

package backend

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// scanTree makes a workspace with files, directories, symlinks (to a
// file, to a directory, dangling, absolute), a fifo, .pulse in two
// spellings, a hidden directory and the paths a pending view decides.
func scanTree(t *testing.T, ws string) {
	t.Helper()
	for _, d := range []string{".pulse/cow", ".PuLsE", "a/b/c", "a/empty", "hid/in", "gone/sub", "merged/sub", "asfile", "deep/1/2/3/4/5/6/7/8"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		".pulse/cow/x": "state", "top": "t", "a/f": "f", "a/b/g": "gg", "a/b/c/h": "hhh", "hid/in/s": "secret",
		"gone/sub/f": "", "merged/base.txt": "base", "merged/over.txt": "ws", "merged/sub/k": "k", "asfile/x": "x",
		"deep/1/2/3/4/5/6/7/8/leaf": "leaf", "-dash": "d", "sp ace": "s", "nl\nname": "n", "wsfile": "under a pending dir",
	}
	for f, data := range files {
		if err := os.WriteFile(filepath.Join(ws, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"l-file": "top", "a/l-dir": "b", "dangling": "nowhere", "abs": "/etc/passwd", "a/b/c/up": "../../f"} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(ws, "a/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "a/b"), fs.ModeSetgid|0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "a/f"), fs.ModeSetuid|0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "a/b/g"), 0); err != nil { // unreadable: it is still listed
		t.Fatal(err)
	}
}

var scanPending = &Pending{View: []PendingEntry{
	{Path: "asfile", Kind: PendingFile},  // a file over a workspace directory
	{Path: "gone", Kind: PendingDeleted}, // with all beneath it
	{Path: "merged", Kind: PendingDir},   // walked into: base.txt shows through
	{Path: "merged/new", Kind: PendingSymlink, Target: "base.txt"},
	{Path: "merged/over.txt", Kind: PendingFile},
	{Path: "wsfile", Kind: PendingDir}, // a directory over a workspace file
	{Path: "new/dir", Kind: PendingDir},
}}

var scanHidden = map[string]bool{"hid": true, "a/b/c/h": true}

// walkBaseStats is the reference: WalkBase, with an lstat of each entry
// as its callers take it (DirEntry.Info), formatted for comparison.
func walkBaseStats(p *Pending, ws string, hidden map[string]bool) (map[string]string, error) {
	out := map[string]string{}
	err := p.WalkBase(ws, hidden, func(rel, _ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		out[rel] = fmt.Sprintf("%o %d %d %d %d", st.Mode, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), st.Ino)
		return nil
	})
	return out, err
}

func scanBaseStats(p *Pending, ws string, hidden map[string]bool) (map[string]string, error) {
	out := map[string]string{}
	err := p.ScanBase(ws, hidden, func(e *BaseEntry) error {
		if _, dup := out[e.Rel]; dup {
			return fmt.Errorf("%s visited twice", e.Rel)
		}
		out[e.Rel] = fmt.Sprintf("%o %d %d %d %d", e.Mode, e.Size, e.Mtime, e.Ctime, e.Ino)
		if e.Type() == unix.S_IFLNK {
			got, err := e.Readlink()
			want, werr := os.Readlink(filepath.Join(ws, e.Rel))
			if err != nil || werr != nil || got != want {
				return fmt.Errorf("readlink %s: %q %v, want %q %v", e.Rel, got, err, want, werr)
			}
		}
		return nil
	})
	return out, err
}

// ScanBase visits what WalkBase visits, with the same lstat of each
// entry, on a tree with every kind of entry, a view, hidden paths and
// .pulse; and fails where WalkBase's callers fail.
func TestScanBaseIsWalkBase(t *testing.T) {
	ws := t.TempDir()
	scanTree(t, ws)
	for _, c := range []struct {
		name   string
		p      *Pending
		hidden map[string]bool
	}{{"no view", nil, nil}, {"view and hidden", scanPending, scanHidden}} {
		want, err := walkBaseStats(c.p, ws, c.hidden)
		if err != nil {
			t.Fatal(err)
		}
		got, err := scanBaseStats(c.p, ws, c.hidden)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: ScanBase\n%v\nWalkBase\n%v", c.name, got, want)
		}
		if len(got) < 20 || got["a/b/g"] == "" || got[".pulse"] != "" || got[".PuLsE"] != "" {
			t.Errorf("%s: %d entries: %v", c.name, len(got), slices.Sorted(maps.Keys(got)))
		}
	}

	// A root that is not a directory is refused, not an empty tree.
	link := filepath.Join(t.TempDir(), "ws")
	if err := os.Symlink(ws, link); err != nil {
		t.Fatal(err)
	}
	if err := (*Pending)(nil).ScanBase(link, nil, func(*BaseEntry) error { return nil }); !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
		t.Errorf("ScanBase of a symlinked root: %v, want ENOTDIR or ELOOP", err)
	}

	// What fn returns ends the scan.
	stop := errors.New("stop")
	if err := (*Pending)(nil).ScanBase(ws, nil, func(*BaseEntry) error { return stop }); err != stop {
		t.Errorf("ScanBase: %v, want fn's error", err)
	}
}

// Directories the caller cannot read or search fail both walks, at the
// same path, unless hidden. Root reads them all, so the comparison runs
// in a child of the test as nobody.
func TestScanBaseUnreadable(t *testing.T) {
	if dir := os.Getenv("PULSE_SCANBASE_CHILD"); dir != "" {
		unreadableCases(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		unreadableCases(t, unreadableTree(t))
		return
	}
	dir := unreadableTree(t)
	// The test binary's own directory is root's alone.
	bin := filepath.Join(dir, "backend.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestScanBaseUnreadable$", "-test.v")
	cmd.Env = append(os.Environ(), "PULSE_SCANBASE_CHILD="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestScanBaseUnreadable") {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
}

// unreadableTree makes, in a directory anyone may enter, one workspace
// per case, each the tree of TestScanBaseIsWalkBase: with a directory
// without r, one without x, and a hidden one without either; as root,
// it gives them all to nobody, who runs the cases.
func unreadableTree(t *testing.T) string {
	dir, err := os.MkdirTemp("", "scanbase")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		_ = os.RemoveAll(dir)
	})
	for _, ws := range []string{"noread", "nosearch", "hiddenbad"} {
		scanTree(t, filepath.Join(dir, ws))
	}
	if err := os.Chmod(filepath.Join(dir, "noread/a/b"), 0o311); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "nosearch/a/b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "hiddenbad/hid"), 0); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 65534, 65534)
		}); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func unreadableCases(t *testing.T, dir string) {
	for _, c := range []struct {
		ws   string
		fail bool
	}{{"noread", true}, {"nosearch", true}, {"hiddenbad", false}} {
		ws := filepath.Join(dir, c.ws)
		want, werr := walkBaseStats(nil, ws, scanHidden)
		got, err := scanBaseStats(nil, ws, scanHidden)
		if !c.fail {
			if err != nil || werr != nil || !maps.Equal(got, want) {
				t.Errorf("%s: ScanBase %v %v, WalkBase %v %v", c.ws, err, got, werr, want)
			}
			continue
		}
		var pe, wpe *fs.PathError
		if !errors.As(err, &pe) || !errors.As(werr, &wpe) || !errors.Is(err, fs.ErrPermission) || !errors.Is(werr, fs.ErrPermission) {
			t.Errorf("%s: ScanBase %v, WalkBase %v: want both to fail with a permission error", c.ws, err, werr)
			continue
		}
		if filepath.Dir(pe.Path) != filepath.Dir(wpe.Path) && pe.Path != wpe.Path {
			t.Errorf("%s: ScanBase failed at %s, WalkBase at %s", c.ws, pe.Path, wpe.Path)
		}
	}
}
