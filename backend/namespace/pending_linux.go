package namespace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/internal/randhex"
)

// layersDir is where pending layers are built, under the state dir. A
// layer is immutable once in place (its id changes with its content), so
// every later command on the same stack reuses it: a command pays only
// for the layers that are new since the last one.
const layersDir = "layers"

// layerMaxAge is how long an unused layer is kept.
const layerMaxAge = 24 * time.Hour

// mergeRun is how many pending layers become one lower directory: a
// command on a stack of hundreds of transactions mounts a few dozen
// directories, not hundreds (each lower directory costs the mount, and
// every lookup through it, some time).
const mergeRun = 32

// pendingLayers makes sure a directory exists for every layer of p and
// returns them, bottom first. Each complete run of mergeRun layers from
// the bottom is one directory holding their merged entries, when they
// can be merged (see mergeLayers); the layers above the last complete run
// are one directory each.
func (b *Backend) pendingLayers(p *backend.Pending) ([]string, error) {
	if p == nil || len(p.Layers) == 0 {
		return nil, nil
	}
	root := filepath.Join(b.o.stateDir, layersDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("namespace: pending layers: %w", err)
	}
	out := make([]string, 0, len(p.Layers))
	built := false
	ensure := func(id string, make func() (*backend.PendingLayer, bool)) (bool, error) {
		dir := filepath.Join(root, id)
		if st, err := os.Lstat(dir); err == nil && st.IsDir() {
			if time.Since(st.ModTime()) > time.Hour {
				now := time.Now()
				_ = os.Chtimes(dir, now, now)
			}
			out = append(out, dir)
			return true, nil
		}
		l, ok := make()
		if !ok {
			return false, nil
		}
		if err := buildLayer(root, dir, l); err != nil {
			return false, fmt.Errorf("namespace: pending layer %s: %w", id, err)
		}
		built = true
		out = append(out, dir)
		return true, nil
	}
	for i := 0; i < len(p.Layers); {
		if run := p.Layers[i:min(i+mergeRun, len(p.Layers))]; len(run) == mergeRun {
			ok, err := ensure(mergedID(run), func() (*backend.PendingLayer, bool) { return mergeLayers(run) })
			if err != nil {
				return nil, err
			}
			if ok {
				i += mergeRun
				continue
			}
		}
		l := &p.Layers[i]
		if _, err := ensure(l.ID, func() (*backend.PendingLayer, bool) { return l, true }); err != nil {
			return nil, err
		}
		i++
	}
	if built {
		pruneLayers(root)
	}
	return out, nil
}

// mergedID names the merge of a run of layers: layer ids change with
// their content, so the same ids in the same order are the same merge.
func mergedID(run []backend.PendingLayer) string {
	h := sha256.New()
	for _, l := range run {
		io.WriteString(h, l.ID)
		h.Write([]byte{0})
	}
	return "merged-" + hex.EncodeToString(h.Sum(nil))[:32]
}

// mergeLayers lays a run of layers, bottom first, into one with the same
// effect as a stack of overlayfs lower directories: a file, symlink or
// whiteout replaces what the layers below had at its path and beneath; a
// directory over a directory merges with it. A directory over a
// non-directory of a layer below would need an opaque directory (the
// layers beneath the run must not show through it), so such a run is not
// merged (ok false) and its layers are mounted one by one.
func mergeLayers(run []backend.PendingLayer) (*backend.PendingLayer, bool) {
	m := map[string]backend.PendingEntry{}
	kids := map[string]map[string]bool{}
	var drop func(p string)
	drop = func(p string) {
		for q := range kids[p] {
			drop(q)
		}
		delete(kids, p)
		delete(m, p)
		if k := kids[path.Dir(p)]; k != nil {
			delete(k, p)
		}
	}
	for _, l := range run {
		for _, e := range l.Entries {
			if e.Kind == backend.PendingDir {
				if prev, ok := m[e.Path]; ok && prev.Kind != backend.PendingDir {
					return nil, false
				}
				for d := path.Dir(e.Path); d != "."; d = path.Dir(d) {
					if prev, ok := m[d]; ok && prev.Kind != backend.PendingDir {
						return nil, false
					}
				}
			} else {
				drop(e.Path)
			}
			m[e.Path] = e
			d := path.Dir(e.Path)
			if kids[d] == nil {
				kids[d] = map[string]bool{}
			}
			kids[d][e.Path] = true
		}
	}
	out := &backend.PendingLayer{ID: mergedID(run), Entries: make([]backend.PendingEntry, 0, len(m))}
	for _, e := range m {
		out.Entries = append(out.Entries, e)
	}
	sort.Slice(out.Entries, func(i, j int) bool { return out.Entries[i].Path < out.Entries[j].Path })
	return out, true
}

// buildLayer writes l as an overlayfs lower directory: files, directories
// and symlinks as they are, deletions as whiteouts (character devices
// 0/0, which unprivileged users may make since Linux 5.8). It is built
// under a temporary name and renamed into place.
func buildLayer(root, dir string, l *backend.PendingLayer) error {
	tmp := filepath.Join(root, ".build-"+l.ID+"-"+randhex.String(6))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	fail := func(err error) error {
		removeAll(tmp)
		return err
	}
	type dirMode struct {
		p string
		m fs.FileMode
	}
	var dirs []dirMode
	// What is beneath a non-directory is hidden by it anyway.
	cuts := map[string]bool{}
entries:
	for i := range l.Entries {
		e := &l.Entries[i]
		for d := path.Dir(e.Path); d != "."; d = path.Dir(d) {
			if cuts[d] {
				continue entries
			}
		}
		if e.Kind != backend.PendingDir {
			cuts[e.Path] = true
		}
		full := filepath.Join(tmp, filepath.FromSlash(e.Path))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			return fail(err)
		}
		switch e.Kind {
		case backend.PendingDir:
			if err := os.Mkdir(full, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fail(err)
			}
			dirs = append(dirs, dirMode{full, e.Mode})
		case backend.PendingFile:
			if err := writeLayerFile(full, e); err != nil {
				return fail(err)
			}
		case backend.PendingSymlink:
			if err := os.Symlink(e.Target, full); err != nil {
				return fail(err)
			}
		case backend.PendingDeleted:
			if err := unix.Mknod(full, unix.S_IFCHR|0o600, 0); err != nil {
				return fail(fmt.Errorf("whiteout %s: %w", e.Path, err))
			}
		}
	}
	// Modes last and deepest first, so that a read-only directory does
	// not stop the ones beneath it from being filled.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i].p) > len(dirs[j].p) })
	for _, d := range dirs {
		if err := os.Chmod(d.p, d.m&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		removeAll(tmp)
		if st, serr := os.Lstat(dir); serr == nil && st.IsDir() {
			return nil // another command built it meanwhile
		}
		return err
	}
	return nil
}

func writeLayerFile(full string, e *backend.PendingEntry) error {
	r, err := e.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, r)
	if err == nil && n != e.Size {
		err = fmt.Errorf("%s: %d bytes, want %d", e.Path, n, e.Size)
	}
	if err == nil {
		err = f.Chmod(e.Mode.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// pruneLayers removes layers no command has used for a day, and builds
// that were abandoned.
func pruneLayers(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < layerMaxAge {
			continue
		}
		removeAll(filepath.Join(root, e.Name()))
	}
}

// lowerView is what the command saw beneath its upper directory: the
// workspace with the pending view over it. The overlay reader asks it
// instead of the workspace, so that a path the command deleted that only
// a pending layer held is reported, and a pending file the command left
// alone is not.
type lowerView struct {
	dir  string
	pend *backend.Pending
}

// pendingInfo is the fs.FileInfo of a pending entry.
type pendingInfo struct{ e *backend.PendingEntry }

func (p pendingInfo) Name() string { return path.Base(p.e.Path) }
func (p pendingInfo) Size() int64  { return p.e.Size }
func (p pendingInfo) Mode() fs.FileMode {
	switch p.e.Kind {
	case backend.PendingDir:
		return fs.ModeDir | p.e.Mode
	case backend.PendingSymlink:
		return fs.ModeSymlink | 0o777
	}
	return p.e.Mode
}
func (p pendingInfo) ModTime() time.Time { return time.Time{} }
func (p pendingInfo) IsDir() bool        { return p.e.Kind == backend.PendingDir }
func (p pendingInfo) Sys() any           { return nil }

// lstat returns the entry the command saw at rel, or nil. wsDir says
// whether the workspace's rel's parent is a real directory all the way
// (the walk knows it); workspace paths are only consulted through real
// directories, never through a symlink.
func (l lowerView) lstat(rel string, wsDir bool) fs.FileInfo {
	if e, decided := l.pend.Lookup(rel); decided {
		if e == nil {
			return nil
		}
		return pendingInfo{e}
	}
	if !wsDir {
		return nil
	}
	st, err := os.Lstat(filepath.Join(l.dir, filepath.FromSlash(rel)))
	if err != nil {
		return nil
	}
	return st
}

// The overlay walk asks by name in the workspace directory it holds
// open (dir, -1 where the workspace has no real directory at rel's
// parent), not by path.

// lstatAt is lstat of rel, the entry name of workspace directory dir.
func (l lowerView) lstatAt(rel string, dir int, name string) fs.FileInfo {
	if e, decided := l.pend.Lookup(rel); decided {
		if e == nil {
			return nil
		}
		return pendingInfo{e}
	}
	if dir < 0 {
		return nil
	}
	var st unix.Stat_t
	if fstatat(dir, name, &st) != nil {
		return nil
	}
	return statInfo{name: name, st: st}
}

// dirAt opens the workspace's real directory name of dir (never through
// a symlink) to look names up in, or returns -1 where there is none.
func (l lowerView) dirAt(dir int, name string) int {
	if dir < 0 {
		return -1
	}
	fd, err := openPathDir(dir, name, unix.O_NOFOLLOW)
	if err != nil {
		return -1
	}
	return fd
}

// sameAt reports whether what the command saw at rel, the entry name of
// workspace directory dir, is a file holding data.
func (l lowerView) sameAt(rel string, dir int, name string, data []byte) bool {
	if e, decided := l.pend.Lookup(rel); decided {
		return e != nil && e.SameContent(data)
	}
	return dir >= 0 && sameContentAt(dir, name, data)
}

// readlinkAt is the target of the link the command saw at rel, the entry
// name of workspace directory dir.
func (l lowerView) readlinkAt(rel string, dir int, name string) (string, error) {
	if e, decided := l.pend.Lookup(rel); decided {
		if e == nil || e.Kind != backend.PendingSymlink {
			return "", fs.ErrNotExist
		}
		return e.Target, nil
	}
	if dir < 0 {
		return "", fs.ErrNotExist
	}
	return readlinkat(dir, name)
}

// statInfo is the fs.FileInfo of a workspace entry's stat.
type statInfo struct {
	name string
	st   unix.Stat_t
}

func (s statInfo) Name() string { return s.name }
func (s statInfo) Size() int64  { return s.st.Size }
func (s statInfo) Mode() fs.FileMode {
	return fsmode.FromStat(s.st.Mode) // with setgid and sticky, as a directory's mode is compared whole
}
func (s statInfo) ModTime() time.Time { return time.Unix(s.st.Mtim.Unix()) }
func (s statInfo) IsDir() bool        { return s.st.Mode&unix.S_IFMT == unix.S_IFDIR }
func (s statInfo) Sys() any           { return &s.st }

// list returns the names the command saw in directory rel.
func (l lowerView) list(rel string, wsDir bool) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	if wsDir {
		entries, err := os.ReadDir(filepath.Join(l.dir, filepath.FromSlash(rel)))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, e := range entries {
			seen[e.Name()] = true
			names = append(names, e.Name())
		}
	}
	for _, n := range l.pend.Children(rel) {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	out := names[:0]
	for _, n := range names {
		if l.lstat(path.Join(rel, n), wsDir) != nil {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}
