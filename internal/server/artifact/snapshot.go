package artifact

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/capture"
	"github.com/pulse-agent/pulse/pathguard"
)

// ErrOverlayTooLarge: the changes of a command exceed the overlay limit.
var ErrOverlayTooLarge = errors.New("overlay too large")

type entry struct {
	mode fs.FileMode // type bits and permissions
	size int64
	hash [sha256.Size]byte
	link string
}

// Snapshot is the state of a workspace, to compute what a command that
// writes in place (the host backend) changed.
type Snapshot struct {
	entries map[string]entry
}

// Take records every entry under dir except the reserved .pulse/.
func Take(dir string) (*Snapshot, error) {
	s := &Snapshot{entries: map[string]entry{}}
	err := walk(dir, func(rel string, e entry, _ *capture.Entry) error {
		s.entries[rel] = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// walkPaths calls fn for every regular file, directory and symlink under
// dir (not dir itself, not the reserved .pulse/), with capture's walk:
// its slash-separated relative path, what an lstat says and, for
// symlinks, the target. Files are read through e.Open, relative to their
// directory and never through a symlink.
func walkPaths(dir string, fn func(e *capture.Entry, link string) error) error {
	return capture.Walk(dir, capture.Options{}, func(e *capture.Entry) error {
		var link string
		switch e.Type() {
		case unix.S_IFREG, unix.S_IFDIR:
		case unix.S_IFLNK:
			var err error
			if link, err = e.Readlink(); err != nil {
				return err
			}
		default:
			// FIFOs, sockets and devices a command made are not content;
			// they are left out rather than failing the walk.
			return nil
		}
		return fn(e, link)
	})
}

// copyFile copies the regular file e to w.
func copyFile(w io.Writer, e *capture.Entry) error {
	f, err := e.Open()
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// walk calls fn with the entry (mode, size, content hash or link target)
// of every path walkPaths visits.
func walk(dir string, fn func(rel string, e entry, ce *capture.Entry) error) error {
	return walkPaths(dir, func(ce *capture.Entry, link string) error {
		e := entry{mode: ce.FileMode() & (fs.ModeType | fs.ModePerm), size: ce.Size, link: link}
		switch ce.Type() {
		case unix.S_IFREG:
			h := sha256.New()
			if err := copyFile(h, ce); err != nil {
				return err
			}
			h.Sum(e.hash[:0])
		case unix.S_IFDIR:
			e.size = 0
		}
		return fn(ce.Rel, e, ce)
	})
}

// Diff returns what changed in dir since the snapshot: created or changed
// entries (file contents read back, at most maxBytes in total) and deleted
// paths. A deleted directory is listed once, not with its contents.
func (s *Snapshot) Diff(dir string, maxBytes int64) (*backend.Overlay, error) {
	ov := &backend.Overlay{}
	seen := map[string]bool{}
	var total int64
	err := walk(dir, func(rel string, e entry, ce *capture.Entry) error {
		seen[rel] = true
		old, ok := s.entries[rel]
		if ok && old == e {
			return nil
		}
		f := backend.File{Path: rel, Mode: e.mode}
		switch {
		case e.mode.IsRegular():
			total += e.size
			if total > maxBytes {
				return fmt.Errorf("%d bytes changed, limit %d: %w", total, maxBytes, ErrOverlayTooLarge)
			}
			var buf bytes.Buffer
			if err := copyFile(&buf, ce); err != nil {
				return err
			}
			f.Data = buf.Bytes()
		case e.mode&fs.ModeSymlink != 0:
			f.Data = []byte(e.link)
		}
		ov.Files = append(ov.Files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("artifact: diff: %w", err)
	}
	ov.Deleted = s.deleted(seen)
	// The walk is in directory order; an overlay lists its files by path.
	sort.Slice(ov.Files, func(i, j int) bool { return ov.Files[i].Path < ov.Files[j].Path })
	return ov, nil
}

// deleted lists, sorted, the snapshot's paths that are not in seen (what
// is there now), a deleted directory once and not with its contents.
func (s *Snapshot) deleted(seen map[string]bool) []string {
	var gone []string
	for rel := range s.entries {
		if !seen[rel] {
			gone = append(gone, rel)
		}
	}
	return pathguard.Topmost(gone)
}
