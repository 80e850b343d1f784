package backend

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/pulse-agent/pulse/pathguard"
)

// Pending is the stack of pending (staged, not yet committed) changes a
// command runs on top of. A capturing backend shows the command the
// workspace as it is on disk now, with every layer laid over it in order:
// bottom first, each entry replacing what is below it at its path, a
// deletion (or a file or symlink) hiding everything beneath. Nothing else
// is in the view: not transactions that were discarded, not paths that
// were refused. The command's Overlay is then relative to that view: a
// path it deletes that only a layer held is listed in Overlay.Deleted.
//
// Layers and View describe the same thing twice, each in the form one
// kind of backend needs: Layers for one that stacks directories
// (overlayfs lower layers, cached by Layer.ID), View for one that copies
// the differences into its own filesystem (Docker, remote).
type Pending struct {
	// Layers are the pending transactions, bottom first. Each holds its
	// own entries plus the directories on the way to them (with the
	// modes the view gives them), so it can be laid over the layers
	// below it as it is.
	Layers []PendingLayer
	// View is the stack reduced to one entry per path, sorted by path:
	// a path not listed, and beneath no listed file, symlink or
	// deletion, is as the workspace has it.
	View []PendingEntry

	idxOnce sync.Once
	idx     *pendingIndex

	checkOnce sync.Once // CheckPending
	checkErr  error
}

// PendingLayer is one pending transaction. The same ID always means the
// same entries, so a backend may cache what it builds from a layer under
// its ID (a letters, digits and '-' only name).
type PendingLayer struct {
	ID      string
	Entries []PendingEntry // sorted by path
}

// PendingKind is what a pending entry puts at its path.
type PendingKind uint8

// The pending entry kinds.
const (
	PendingFile    PendingKind = iota + 1 // a regular file: Mode, Size, Open
	PendingDir                            // a directory: Mode; merges with what is below
	PendingSymlink                        // a symlink to Target
	PendingDeleted                        // absent, with everything beneath
)

// PendingEntry is one path of a layer or of the view. Paths are
// slash-separated, relative to the workspace, cleaned, never under .pulse.
type PendingEntry struct {
	Path   string
	Kind   PendingKind
	Mode   fs.FileMode // permission bits (and setgid, sticky on directories)
	Size   int64
	Target string
	// SHA is the hex SHA-256 of a file's content, when known: a backend
	// that copies may skip a file whose content it already holds.
	SHA string
	// Open returns a file's content. It may fail once the transaction
	// holding it has been committed or discarded; a backend then fails
	// the command rather than show it something else.
	Open func() (io.ReadCloser, error) `json:"-"`
}

// ValidLayerID reports whether id may name a cache directory.
func ValidLayerID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
			return false
		}
	}
	return true
}

// Empty reports whether there is nothing pending.
func (p *Pending) Empty() bool { return p == nil || len(p.View) == 0 && len(p.Layers) == 0 }

type pendingIndex struct {
	byPath map[string]*PendingEntry
	kids   map[string][]string // directory → names of view entries directly beneath
}

func (p *Pending) index() *pendingIndex {
	p.idxOnce.Do(p.buildIndex)
	return p.idx
}

func (p *Pending) buildIndex() {
	ix := &pendingIndex{byPath: make(map[string]*PendingEntry, len(p.View)), kids: map[string][]string{}}
	for i := range p.View {
		e := &p.View[i]
		ix.byPath[e.Path] = e
		d := path.Dir(e.Path)
		ix.kids[d] = append(ix.kids[d], path.Base(e.Path))
	}
	p.idx = ix
}

// Lookup says what the view shows at rel. decided is false when the
// workspace shows through; otherwise e is the entry, or nil when rel is
// absent (deleted, or beneath a pending file, symlink or deletion). It is
// safe for concurrent use once the Pending is no longer modified.
func (p *Pending) Lookup(rel string) (e *PendingEntry, decided bool) {
	if p == nil || len(p.View) == 0 {
		return nil, false
	}
	ix := p.index()
	for i := 0; i < len(rel); i++ {
		if rel[i] == '/' {
			if a := ix.byPath[rel[:i]]; a != nil && a.Kind != PendingDir {
				return nil, true
			}
		}
	}
	e = ix.byPath[rel]
	if e == nil {
		return nil, false
	}
	if e.Kind == PendingDeleted {
		return nil, true
	}
	return e, true
}

// WalkBase walks the workspace ws under the view, for a backend that
// copies it: the entries pathguard.WalkWorkspace visits, minus the hidden
// paths (each with all beneath it) and minus every path the view decides,
// which the caller takes from Shown instead. A pending directory over a
// workspace one is walked into, since what it holds may show through.
// Works on a nil Pending (it decides nothing).
func (p *Pending) WalkBase(ws string, hidden map[string]bool, fn pathguard.WalkFunc) error {
	return pathguard.WalkWorkspace(ws, func(rel, abs string, d fs.DirEntry, err error) error {
		if err != nil {
			return fn(rel, abs, d, err)
		}
		skip := hidden[rel]
		if !skip {
			if e, decided := p.Lookup(rel); decided {
				if d.IsDir() && e != nil && e.Kind == PendingDir {
					return nil
				}
				skip = true
			}
		}
		if skip {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		return fn(rel, abs, d, err)
	})
}

// Shown returns the entries of the view that show over the workspace, in
// view order (so a directory comes before what it holds): neither deleted
// nor beneath a deletion, file or symlink, nor at or beneath a hidden
// path. With WalkBase it is the whole tree a copying backend lays out.
func (p *Pending) Shown(hidden map[string]bool) []*PendingEntry {
	if p == nil {
		return nil
	}
	var out []*PendingEntry
	for i := range p.View {
		e := &p.View[i]
		if got, decided := p.Lookup(e.Path); !decided || got == nil || hiddenAt(hidden, e.Path) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// hiddenAt reports whether rel or one of its ancestors is hidden.
func hiddenAt(hidden map[string]bool, rel string) bool {
	for q := rel; q != "." && q != "/"; q = path.Dir(q) {
		if hidden[q] {
			return true
		}
	}
	return false
}

// Children returns the names of the view's entries directly beneath the
// directory rel ("." for the root), deleted ones included, sorted.
func (p *Pending) Children(rel string) []string {
	if p == nil || len(p.View) == 0 {
		return nil
	}
	names := append([]string(nil), p.index().kids[rel]...)
	sort.Strings(names)
	return names
}

// ReadAll returns a pending file's content, checking its size.
func (e *PendingEntry) ReadAll() ([]byte, error) {
	if e.Kind != PendingFile || e.Open == nil {
		return nil, fmt.Errorf("pending %q is not a file", e.Path)
	}
	r, err := e.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, e.Size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != e.Size {
		return nil, fmt.Errorf("pending %q holds %d bytes, not %d", e.Path, len(b), e.Size)
	}
	return b, nil
}

// SameContent reports whether a pending file holds exactly data.
func (e *PendingEntry) SameContent(data []byte) bool {
	if e.Kind != PendingFile || e.Size != int64(len(data)) {
		return false
	}
	b, err := e.ReadAll()
	return err == nil && bytes.Equal(b, data)
}

// CheckPending validates what a backend is about to lay over a
// workspace: clean relative paths outside .pulse, known kinds, valid
// layer ids. A backend calls it before using a request's Pending. The
// answer is kept with p (a Pending is never modified once a backend has
// it, see Lookup), so a stack of thousands of entries reused by command
// after command is checked once.
func CheckPending(p *Pending) error {
	if p == nil {
		return nil
	}
	p.checkOnce.Do(func() { p.checkErr = checkPending(p) })
	return p.checkErr
}

func checkPending(p *Pending) error {
	check := func(e *PendingEntry) error {
		if !pathguard.IsWorkspacePath(e.Path) {
			return fmt.Errorf("%w: pending path %q", ErrInvalidRequest, e.Path)
		}
		switch e.Kind {
		case PendingFile:
			if e.Open == nil || e.Size < 0 {
				return fmt.Errorf("%w: pending file %q has no content", ErrInvalidRequest, e.Path)
			}
		case PendingDir, PendingDeleted:
		case PendingSymlink:
			if e.Target == "" || strings.IndexByte(e.Target, 0) >= 0 {
				return fmt.Errorf("%w: pending symlink %q has a bad target", ErrInvalidRequest, e.Path)
			}
		default:
			return fmt.Errorf("%w: pending %q has unknown kind %d", ErrInvalidRequest, e.Path, e.Kind)
		}
		return nil
	}
	for i := range p.View {
		if err := check(&p.View[i]); err != nil {
			return err
		}
	}
	for _, l := range p.Layers {
		if !ValidLayerID(l.ID) {
			return fmt.Errorf("%w: pending layer id %q", ErrInvalidRequest, l.ID)
		}
		for i := range l.Entries {
			if err := check(&l.Entries[i]); err != nil {
				return err
			}
		}
	}
	return nil
}
