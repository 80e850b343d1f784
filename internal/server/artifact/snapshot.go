package artifact

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/backend"
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
	err := walk(dir, func(rel string, e entry) error {
		s.entries[rel] = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// walkPaths calls fn for every regular file, directory and symlink under
// dir (not dir itself, not the reserved .pulse/), with its slash-separated
// relative path and, for symlinks, the target.
func walkPaths(dir string, fn func(rel, abs string, info fs.FileInfo, link string) error) error {
	return pathguard.WalkWorkspace(dir, func(rel, p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case info.Mode().IsRegular(), info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			// FIFOs, sockets and devices a command made are not content;
			// they are left out rather than failing the walk.
			return nil
		}
		return fn(rel, p, info, link)
	})
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// walk calls fn with the entry (mode, size, content hash or link target)
// of every path walkPaths visits.
func walk(dir string, fn func(rel string, e entry) error) error {
	return walkPaths(dir, func(rel, abs string, info fs.FileInfo, link string) error {
		e := entry{mode: info.Mode() & (fs.ModeType | fs.ModePerm), size: info.Size(), link: link}
		switch {
		case info.Mode().IsRegular():
			h, err := hashFile(abs)
			if err != nil {
				return err
			}
			e.hash = h
		case info.IsDir():
			e.size = 0
		}
		return fn(rel, e)
	})
}

func hashFile(p string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	f, err := os.Open(p)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// Diff returns what changed in dir since the snapshot: created or changed
// entries (file contents read back, at most maxBytes in total) and deleted
// paths. A deleted directory is listed once, not with its contents.
func (s *Snapshot) Diff(dir string, maxBytes int64) (*backend.Overlay, error) {
	ov := &backend.Overlay{}
	seen := map[string]bool{}
	var total int64
	err := walk(dir, func(rel string, e entry) error {
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
			data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
			if err != nil {
				return err
			}
			f.Data = data
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
