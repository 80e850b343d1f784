//go:build linux

package capture

import (
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/pathguard"
)

func tree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{".pulse/cow", "a/b", "skip/in", "within/sub"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for f, data := range map[string]string{"top": "t", "a/f": "ff", "a/b/g": "ggg", "skip/in/s": "s", "within/w": "w", "within/sub/x": "x", ".pulse/cow/x": "state"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("top", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "a/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "a/b"), fs.ModeSetgid|0o750); err != nil {
		t.Fatal(err)
	}
	return root
}

func collect(t *testing.T, root string, o Options) (map[string]fs.FileMode, error) {
	t.Helper()
	got := map[string]fs.FileMode{}
	err := Walk(root, o, func(e *Entry) error {
		if _, dup := got[e.Rel]; dup {
			t.Errorf("%s visited twice", e.Rel)
		}
		got[e.Rel] = e.FileMode()
		fi, err := os.Lstat(filepath.Join(root, e.Rel))
		if err != nil {
			return err
		}
		// FileMode is what os.Lstat says, bit for bit.
		if fi.Mode() != e.FileMode() || (e.Type() == unix.S_IFREG && fi.Size() != e.Size) || e.Path() != filepath.Join(root, e.Rel) {
			t.Errorf("%s: mode %v size %d path %s, lstat says %v %d", e.Rel, e.FileMode(), e.Size, e.Path(), fi.Mode(), fi.Size())
		}
		return nil
	})
	return got, err
}

func TestWalkVisitsTheTreeButReservedAndFiltered(t *testing.T) {
	root := tree(t)
	got, err := collect(t, root, Options{Filter: func(rel string) Verdict {
		switch rel {
		case "skip":
			return Skip
		case "within", "top":
			return Within // a directory walked into; a file left out
		}
		return Visit
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "a/b", "a/b/g", "a/f", "a/fifo", "link", "within/sub", "within/sub/x", "within/w"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Errorf("visited %q, want %q", keys, want)
	}
	if got["a/b"] != fs.ModeDir|fs.ModeSetgid|0o750 || got["link"]&fs.ModeSymlink == 0 || got["a/fifo"]&fs.ModeNamedPipe == 0 {
		t.Errorf("modes %v", got)
	}
}

func TestWalkRefusesASymlinkedRoot(t *testing.T) {
	root := tree(t)
	link := filepath.Join(t.TempDir(), "root")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	if err := Walk(link, Options{}, func(*Entry) error { return nil }); !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
		t.Errorf("Walk of a symlinked root: %v, want ENOTDIR or ELOOP", err)
	}
	stop := errors.New("stop")
	if err := Walk(root, Options{}, func(*Entry) error { return stop }); err != stop {
		t.Errorf("Walk: %v, want fn's error as it is", err)
	}
}

// An entry that goes away between the directory's read and its lstat
// fails a strict walk and is left out of a lenient one, and of one that
// leaves out what vanished.
func TestWalkLenientLeavesOutWhatVanished(t *testing.T) {
	for _, o := range []Options{{}, {Lenient: true}, {Vanished: true}} {
		lenient := o.Lenient || o.Vanished
		root := tree(t)
		for _, f := range []string{"v/1", "v/2"} {
			if err := os.MkdirAll(filepath.Join(root, "v"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		gone := ""
		err := Walk(root, o, func(e *Entry) error {
			got = append(got, e.Rel)
			if (e.Rel == "v/1" || e.Rel == "v/2") && gone == "" {
				// Both names in v were read (getdents) before either
				// is stat'ed: the other one goes now.
				gone = map[string]string{"v/1": "v/2", "v/2": "v/1"}[e.Rel]
				if err := os.Remove(filepath.Join(root, gone)); err != nil {
					return err
				}
			}
			return nil
		})
		switch {
		case !lenient && !errors.Is(err, fs.ErrNotExist):
			t.Errorf("strict: %v, want ErrNotExist", err)
		case lenient && (err != nil || gone == "" || slices.Contains(got, gone) || !slices.Contains(got, "a/b/g")):
			t.Errorf("lenient: %v, visited %q", err, got)
		}
	}
}

// Open reads a regular file, and refuses what replaced it after the
// lstat: a symlink (never followed) or a FIFO (never blocks).
func TestEntryOpenRefusesAReplacedFile(t *testing.T) {
	root := tree(t)
	err := Walk(root, Options{}, func(e *Entry) error {
		switch e.Rel {
		case "a/b/g":
			f, err := e.Open()
			if err != nil {
				return err
			}
			defer f.Close()
			if b, err := io.ReadAll(f); err != nil || string(b) != "ggg" {
				t.Errorf("read %q %v", b, err)
			}
		case "top":
			os.Remove(e.Path())
			if err := os.Symlink("/etc/passwd", e.Path()); err != nil {
				return err
			}
			if f, err := e.Open(); err == nil {
				f.Close()
				t.Error("Open followed a symlink put in the file's place")
			}
		case "a/f":
			os.Remove(e.Path())
			if err := unix.Mkfifo(e.Path(), 0o600); err != nil {
				return err
			}
			if f, err := e.Open(); !errors.Is(err, ErrChanged) {
				if f != nil {
					f.Close()
				}
				t.Errorf("Open of a FIFO in the file's place: %v, want ErrChanged", err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Vanished leaves out only what is gone: a directory that became a file
// between its lstat and its open fails the walk.
func TestWalkVanishedFailsOnOtherErrors(t *testing.T) {
	root := tree(t)
	err := Walk(root, Options{Vanished: true}, func(e *Entry) error {
		if e.Rel == "within" {
			if err := os.RemoveAll(e.Path()); err != nil {
				return err
			}
			return os.WriteFile(e.Path(), nil, 0o644)
		}
		return nil
	})
	if !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("Walk: %v, want ENOTDIR", err)
	}
}

// Sorted gives each directory's names in byte order, a directory before
// what it holds; KeepReserved visits .pulse (here left to Filter, which
// skips only one spelling); fs.SkipDir leaves a directory's entries out and
// goes on; Nlink counts the links.
func TestWalkSortedKeepReservedSkipDir(t *testing.T) {
	root := tree(t)
	for _, n := range []string{"Z", "b", "a0", ".Pulse"} {
		if err := os.WriteFile(filepath.Join(root, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(root, "top"), filepath.Join(root, "top2")); err != nil {
		t.Fatal(err)
	}
	var got []string
	links := map[string]uint64{}
	err := Walk(root, Options{Sorted: true, KeepReserved: true, Filter: func(rel string) Verdict {
		if rel == ".pulse/cow" {
			return Skip
		}
		return Visit
	}}, func(e *Entry) error {
		got = append(got, e.Rel)
		links[e.Rel] = e.Nlink
		if e.Rel == "a/b" {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".Pulse", ".pulse", "Z", "a", "a/b", "a/f", "a/fifo", "a0", "b", "link", "skip", "skip/in", "skip/in/s",
		"top", "top2", "within", "within/sub", "within/sub/x", "within/w"}
	if !slices.Equal(got, want) {
		t.Errorf("visited %q\nwant    %q", got, want)
	}
	if links["top"] != 2 || links["top2"] != 2 || links["a/f"] != 1 {
		t.Errorf("links %v", links)
	}
}

func TestReservedIsPathguards(t *testing.T) {
	if reserved != pathguard.ReservedDir {
		t.Errorf("reserved %q, pathguard.ReservedDir %q", reserved, pathguard.ReservedDir)
	}
	for _, n := range []string{".pulse", ".PULSE", ".Pulse", "pulse", ".pulse2"} {
		if strings.EqualFold(n, reserved) != pathguard.IsReserved(n) {
			t.Errorf("%q: capture and pathguard disagree", n)
		}
	}
}
