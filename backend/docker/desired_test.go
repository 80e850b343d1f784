//go:build linux

package docker

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// desiredWalkDir is desired as it was before ScanBase: WalkBase, an lstat
// per entry through DirEntry.Info, wsSig of the FileInfo. It is the
// reference desired is compared with.
func desiredWalkDir(ws string, pend *backend.Pending, hiddenList []string, since time.Time) (map[string]want, error) {
	out := map[string]want{}
	hidden := map[string]bool{}
	for _, h := range hiddenList {
		hidden[h] = true
	}
	err := pend.WalkBase(ws, hidden, func(rel, p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var w want
		switch {
		case d.IsDir():
			w = want{kind: 'd', mode: info.Mode()}
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			w = want{kind: 'l', tgt: t}
		case d.Type().IsRegular():
			w = want{kind: '-', mode: info.Mode()}
		default:
			return nil
		}
		w.sig = wsSig(info, w.tgt, since)
		out[rel] = w
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, e := range pend.Shown(hidden) {
		out[e.Path] = want{kind: 'x', sig: e.Path} // as desired makes them; compared apart
	}
	return out, nil
}

// desired gives every entry of the workspace the kind, mode, target and
// signature the FileInfo walk gave it, on a tree of every kind of entry,
// with a pending view, hidden paths and .pulse; aged (stable signatures,
// which must be equal byte for byte: a warm container's model written by
// one release is read by the next) and just changed (racy ones, which
// must match nothing).
func TestDesiredIsTheFileInfoWalk(t *testing.T) {
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{
		".pulse/x": "state", ".Pulse/y": "state", "a": "aaaa", "d/b": "bb", "d/e/c": "", "hid/s": "secret",
		"over/base": "b", "over/mine": "ws", "del/f": "f", "-x": "dash", "sp ace": "s",
	})
	for link, target := range map[string]string{"l": "a", "d/ld": "e", "dangling": "nowhere"} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(ws, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]fs.FileMode{"d": fs.ModeSetgid | 0o750, "a": fs.ModeSetuid | 0o711, "d/b": 0, "d/e": fs.ModeSticky | 0o777} {
		if err := os.Chmod(filepath.Join(ws, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	pend := &backend.Pending{View: []backend.PendingEntry{
		{Path: "del", Kind: backend.PendingDeleted},
		{Path: "over", Kind: backend.PendingDir, Mode: 0o700},
		{Path: "over/mine", Kind: backend.PendingFile, Size: 1, SHA: strings.Repeat("0", 64), Mode: 0o600},
	}}
	hidden := []string{"hid"}
	for _, c := range []struct {
		name  string
		since time.Time
		racy  bool
	}{{"aged", time.Now().Add(time.Minute), false}, {"just changed", time.Now(), true}} {
		got, err := desired(ws, pend, hidden, c.since)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := desiredWalkDir(ws, pend, hidden, c.since)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(ref) || len(got) < 12 {
			t.Errorf("%s: desired has %d entries, the FileInfo walk %d", c.name, len(got), len(ref))
		}
		for p, r := range ref {
			g, ok := got[p]
			switch {
			case !ok:
				t.Errorf("%s: %s missing", c.name, p)
			case r.kind == 'x':
				if g.kind == 'x' || g.kind == '-' {
					t.Errorf("%s: %s: a pending entry came as %+v", c.name, p, g)
				}
			case g.kind != r.kind || tarMode(g.mode) != tarMode(r.mode) || g.mode.IsDir() != r.mode.IsDir() || g.tgt != r.tgt:
				t.Errorf("%s: %s: %+v, want %+v", c.name, p, g, r)
			case c.racy && r.kind == '-':
				if !strings.HasPrefix(g.sig, "r|") || !strings.HasPrefix(r.sig, "r|") || g.sig == r.sig {
					t.Errorf("%s: %s: signatures %q and %q, want two racy ones", c.name, p, g.sig, r.sig)
				}
			case g.sig != r.sig:
				t.Errorf("%s: %s: signature %q, want %q", c.name, p, g.sig, r.sig)
			}
		}
		for _, p := range []string{".pulse/x", ".Pulse", "hid", "hid/s", "del", "del/f", "fifo"} {
			if _, ok := got[p]; ok {
				t.Errorf("%s: %s is in desired", c.name, p)
			}
		}
		if w := got["a"]; !c.racy && w.sig != fmt.Sprintf("w|4711|4|%d|%d|%d", mtimeOf(t, ws, "a"), ctimeOf(t, ws, "a"), inoOf(t, ws, "a")) {
			t.Errorf("%s: a: signature %q", c.name, w.sig)
		}
	}
}

func lstatOf(t *testing.T, ws, rel string) *unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(ws, rel), &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func mtimeOf(t *testing.T, ws, rel string) int64 { return lstatOf(t, ws, rel).Mtim.Nano() }
func ctimeOf(t *testing.T, ws, rel string) int64 { return lstatOf(t, ws, rel).Ctim.Nano() }
func inoOf(t *testing.T, ws, rel string) uint64  { return lstatOf(t, ws, rel).Ino }

// BenchmarkDesired: desired of this repository's checkout against the
// FileInfo walk it replaced (desiredWalkDir), alternately, in the same
// run (x-vs-fileinfo-walk); the walk every command on Docker pays.
func BenchmarkDesired(b *testing.B) {
	ws, err := filepath.Abs("../..")
	if err != nil {
		b.Fatal(err)
	}
	var ours, ref time.Duration
	n := 0
	for range b.N {
		start := time.Now()
		w, err := desired(ws, nil, nil, start)
		ours += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		n = len(w)
		start = time.Now()
		if _, err := desiredWalkDir(ws, nil, nil, start); err != nil {
			b.Fatal(err)
		}
		ref += time.Since(start)
	}
	b.ReportMetric(float64(n), "entries")
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-fileinfo-walk")
}
