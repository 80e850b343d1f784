package backendtest

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// The pending-stack cases drive a backend the way the facade does: each
// command's Overlay becomes the next layer of Request.Pending (with the
// deletions beneath a removed workspace directory made explicit, as the
// staging layer records them), and every command must see exactly the
// workspace plus the layers given.

// stackSim is a pending stack built from overlays.
type stackSim struct {
	e      *env
	layers []backend.PendingLayer
	n      int
}

func (e *env) stacks() bool { return e.caps.CapturesWrites && e.caps.StacksPending }

func (s *suite) setupStack(t *testing.T) (*env, *stackSim) {
	e := s.setup(t)
	if !e.stacks() {
		t.Skip("the backend does not run commands on a pending stack (it writes in place, or lacks Capabilities.StacksPending)")
	}
	return e, &stackSim{e: e}
}

func bytesOpen(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// wsHas reports the workspace entry at rel (not following symlinks).
func (st *stackSim) wsHas(rel string) (fs.FileInfo, bool) {
	fi, err := os.Lstat(filepath.Join(st.e.ws, filepath.FromSlash(rel)))
	return fi, err == nil
}

// push turns ov into the top layer.
func (st *stackSim) push(ov *backend.Overlay) {
	if ov.Empty() {
		return
	}
	st.n++
	m := map[string]backend.PendingEntry{}
	for _, p := range ov.Deleted {
		m[p] = backend.PendingEntry{Path: p, Kind: backend.PendingDeleted}
		if fi, ok := st.wsHas(p); ok && fi.IsDir() {
			root := filepath.Join(st.e.ws, filepath.FromSlash(p))
			_ = filepath.WalkDir(root, func(q string, d fs.DirEntry, err error) error {
				if err != nil || q == root {
					return nil
				}
				rel, _ := filepath.Rel(st.e.ws, q)
				rel = filepath.ToSlash(rel)
				if _, ok := m[rel]; !ok {
					m[rel] = backend.PendingEntry{Path: rel, Kind: backend.PendingDeleted}
				}
				return nil
			})
		}
	}
	for _, f := range ov.Files {
		e := backend.PendingEntry{Path: f.Path, Mode: f.Mode.Perm()}
		switch {
		case f.Mode&fs.ModeDir != 0:
			e.Kind, e.Mode = backend.PendingDir, f.Mode&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky)
		case f.Mode&fs.ModeSymlink != 0:
			e.Kind, e.Target = backend.PendingSymlink, string(f.Data)
		default:
			data := bytes.Clone(f.Data)
			e.Kind, e.Size, e.Open = backend.PendingFile, int64(len(data)), bytesOpen(data)
		}
		m[f.Path] = e
	}
	for p := range m {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := m[d]; !ok {
				mode := fs.FileMode(0o755)
				if fi, ok := st.wsHas(d); ok && fi.IsDir() {
					mode = fi.Mode().Perm()
				}
				m[d] = backend.PendingEntry{Path: d, Kind: backend.PendingDir, Mode: mode}
			}
		}
	}
	l := backend.PendingLayer{ID: fmt.Sprintf("bt-%d-%d", len(st.layers), st.n)}
	for _, e := range m {
		l.Entries = append(l.Entries, e)
	}
	sort.Slice(l.Entries, func(i, j int) bool { return l.Entries[i].Path < l.Entries[j].Path })
	st.layers = append(st.layers, l)
}

// drop takes layer i out, as discarding its transaction does.
func (st *stackSim) drop(i int) { st.layers = append(st.layers[:i:i], st.layers[i+1:]...) }

// pending is the stack for the next request: its layers and their view.
func (st *stackSim) pending() *backend.Pending {
	if len(st.layers) == 0 {
		return nil
	}
	view := map[string]backend.PendingEntry{}
	for _, l := range st.layers {
		for _, e := range l.Entries {
			if e.Kind != backend.PendingDir {
				prefix := e.Path + "/"
				for q := range view {
					if !strings.HasPrefix(q, prefix) {
						continue
					}
					if _, ok := st.wsHas(q); ok {
						view[q] = backend.PendingEntry{Path: q, Kind: backend.PendingDeleted}
					} else {
						delete(view, q)
					}
				}
			}
			view[e.Path] = e
		}
	}
	p := &backend.Pending{Layers: st.layers}
	for _, e := range view {
		p.View = append(p.View, e)
	}
	sort.Slice(p.View, func(i, j int) bool { return p.View[i].Path < p.View[j].Path })
	return p
}

// run runs script on the stack, pushes its overlay, and returns stdout.
func (st *stackSim) run(script string) (*backend.Result, string) {
	st.e.t.Helper()
	var out, errb recorder
	res := st.e.exec(st.e.t.Context(), &backend.Request{Shell: script, Stdout: &out, Stderr: &errb, Pending: st.pending()})
	if res.ExitCode != 0 {
		st.e.t.Fatalf("%q on a stack of %d: exit %d, stderr %q", script, len(st.layers), res.ExitCode, errb.String())
	}
	if res.Overlay == nil {
		st.e.t.Fatalf("%q: a capturing backend returned no overlay", script)
	}
	st.push(res.Overlay)
	return res, out.String()
}

func overlayHas(ov *backend.Overlay, p string) (backend.File, bool) {
	for _, f := range ov.Files {
		if f.Path == p {
			return f, true
		}
	}
	return backend.File{}, false
}

func deleted(ov *backend.Overlay, p string) bool {
	for _, d := range ov.Deleted {
		if d == p {
			return true
		}
	}
	return false
}

// testStackSeesPending: a command sees the layers below it, and its
// overlay is relative to that view.
func testStackSeesPending(t *testing.T, s *suite) {
	e, st := s.setupStack(t)
	e.writeFile("base.txt", []byte("base\n"))
	e.writeFile("same.txt", []byte("same\n"))
	st.run("echo one > a.txt && mkdir -p d/e && echo deep > d/e/f && ln -s a.txt l && rm base.txt")
	res, out := st.run("cat a.txt d/e/f l; test ! -e base.txt && echo nobase; echo two >> a.txt; rm d/e/f; cat same.txt >/dev/null")
	if out != "one\ndeep\none\nnobase\n" {
		t.Fatalf("the second command saw %q", out)
	}
	if f, ok := overlayHas(res.Overlay, "a.txt"); !ok || string(f.Data) != "one\ntwo\n" {
		t.Errorf("a.txt in the overlay: %+v %v", f, ok)
	}
	if !deleted(res.Overlay, "d/e/f") {
		t.Errorf("a pending-only file the command removed is not in Overlay.Deleted: %v", res.Overlay.Deleted)
	}
	if _, ok := overlayHas(res.Overlay, "l"); ok {
		t.Error("a pending symlink the command left alone is reported changed")
	}
	if _, out := st.run("cat a.txt; test ! -e d/e/f && echo nof"); out != "one\ntwo\nnof\n" {
		t.Fatalf("the third command saw %q", out)
	}
	if _, err := os.Lstat(filepath.Join(e.ws, "a.txt")); err == nil {
		t.Fatal("the workspace was written")
	}
}

// testStackDiscardHides: a layer taken out of the stack is out of the
// view, and a host edit between commands is seen unless a layer covers
// the path.
func testStackDiscardHides(t *testing.T, s *suite) {
	e, st := s.setupStack(t)
	e.writeFile("host.txt", []byte("v1\n"))
	st.run("echo dropped > a.txt")
	st.run("echo kept > b.txt && echo pending > covered.txt")
	st.drop(0)
	e.writeFile("host.txt", []byte("v2\n"))
	e.writeFile("covered.txt", []byte("host\n"))
	if _, out := st.run("test ! -e a.txt && echo gone; cat b.txt host.txt covered.txt"); out != "gone\nkept\nv2\npending\n" {
		t.Fatalf("after a discard and host edits the command saw %q", out)
	}
}

// testStackReplaceAcrossSteps: modes, renames, rm -r of a directory, a
// file replaced by a directory and back, symlinks, across commands.
func testStackReplaceAcrossSteps(t *testing.T, s *suite) {
	e, st := s.setupStack(t)
	e.writeFile("tree/x/y.txt", []byte("y\n"))
	e.writeFile("f", []byte("file\n"))
	st.run("chmod 600 f && mkdir -p made/sub && echo m > made/sub/m && ln -s tree/x/y.txt link")
	st.run("mv made/sub/m made/m2 && rm -r made/sub && rm -r tree && rm f && mkdir f && echo in > f/inner")
	st.run("rm -r f && echo back > f && mkdir tree && echo new > tree/n")
	_, out := st.run("cat made/m2 f tree/n; test ! -e made/sub && test ! -e tree/x && echo clean; test -L link && echo link")
	if out != "m\nback\nnew\nclean\nlink\n" {
		t.Fatalf("after the replacements the command saw %q", out)
	}
	if _, out := st.run("stat -c %a made/m2"); out == "" {
		t.Fatal("stat printed nothing")
	}
}

// testStackLongSession: 200 commands, each on the layers of all before.
func testStackLongSession(t *testing.T, s *suite) {
	_, st := s.setupStack(t)
	const n = 200
	for i := range n {
		st.run(fmt.Sprintf("c=$(cat count 2>/dev/null || echo 0); echo $((c+1)) > count; echo %d > f%d", i, i%7))
	}
	if _, out := st.run("cat count f3"); out != fmt.Sprintf("%d\n%d\n", n, n-1-(n-1-3)%7) {
		t.Fatalf("after %d commands: %q", n, out)
	}
}
