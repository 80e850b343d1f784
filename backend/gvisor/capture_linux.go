//go:build linux

package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
)

// maxOverlayTotal bounds the bytes of written files one overlay holds in
// memory (a variable so that a test can lower it to provoke
// ErrOverlayTooLarge).
var maxOverlayTotal int64 = 2 << 30

// ErrOverlayTooLarge: what the command wrote is over maxOverlayTotal.
var ErrOverlayTooLarge = errors.New("gvisor: overlay too large to capture")

// capture reads the upper directory of a finished command against lower,
// the view it saw, into an overlay. Nothing writes either any more: the
// sandbox is gone and the overlay unmounted.
func capture(upper, lower string) (*backend.Overlay, error) {
	c := &capturer{upper: upper, lower: lower}
	if err := c.walk(".", true); err != nil {
		return nil, err
	}
	ov := &backend.Overlay{Files: c.files, Deleted: c.deleted}
	sort.Strings(ov.Deleted)
	return ov, nil
}

type capturer struct {
	upper, lower string
	files        []backend.File
	deleted      []string
	size         int64
}

func (c *capturer) up(p string) string  { return filepath.Join(c.upper, filepath.FromSlash(p)) }
func (c *capturer) low(p string) string { return filepath.Join(c.lower, filepath.FromSlash(p)) }

// lstatLower is what the command saw at p, nil for nothing. seen says
// the lower view has a real directory at p's parent: otherwise nothing
// was there, and the lookup must not follow what is (a symlink the
// command replaced by a directory would lead it out of the view).
func (c *capturer) lstatLower(p string, seen bool) fs.FileInfo {
	if !seen {
		return nil
	}
	st, err := os.Lstat(c.low(p))
	if err != nil {
		return nil
	}
	return st
}

// walk reads the upper directory rel; seen says the lower view has a
// real directory there.
func (c *capturer) walk(rel string, seen bool) error {
	ents, err := os.ReadDir(c.up(rel))
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(rel, e.Name())
		if p == pathguard.ReservedDir {
			// The directory the sandbox hides (a whiteout in the
			// layer): what the command made there is not the
			// workspace's.
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(c.up(p), &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: c.up(p), Err: err}
		}
		lst := c.lstatLower(p, seen)
		perm := fs.FileMode(st.Mode & 0o777)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if err := c.file(p, perm, st.Size, lst); err != nil {
				return err
			}
		case unix.S_IFLNK:
			t, err := os.Readlink(c.up(p))
			if err != nil {
				return err
			}
			if lst != nil && lst.Mode()&fs.ModeSymlink != 0 {
				if lt, err := os.Readlink(c.low(p)); err == nil && lt == t {
					continue
				}
			}
			c.files = append(c.files, backend.File{Path: p, Mode: fs.ModeSymlink, Data: []byte(t)})
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				// A whiteout: a deletion of what the command saw. At a
				// hidden path the command saw nothing, so it is none.
				if lst != nil {
					c.deleted = append(c.deleted, p)
				}
				continue
			}
			c.special(p, fs.ModeDevice|fs.ModeCharDevice|perm, lst)
		case unix.S_IFDIR:
			dperm := perm
			if st.Mode&unix.S_ISGID != 0 {
				dperm |= fs.ModeSetgid
			}
			if st.Mode&unix.S_ISVTX != 0 {
				dperm |= fs.ModeSticky
			}
			if err := c.dir(p, dperm, lst); err != nil {
				return err
			}
		case unix.S_IFIFO:
			c.special(p, fs.ModeNamedPipe|perm, lst)
		case unix.S_IFSOCK:
			c.special(p, fs.ModeSocket|perm, lst)
		case unix.S_IFBLK:
			c.special(p, fs.ModeDevice|perm, lst)
		}
	}
	return nil
}

// special reports a FIFO, socket or device node (see backend.File); what
// it replaced is a deletion.
func (c *capturer) special(p string, mode fs.FileMode, lst fs.FileInfo) {
	c.files = append(c.files, backend.File{Path: p, Mode: mode})
	if lst != nil {
		c.deleted = append(c.deleted, p)
	}
}

func (c *capturer) file(p string, perm fs.FileMode, size int64, lst fs.FileInfo) error {
	if c.size += size; c.size > maxOverlayTotal {
		return fmt.Errorf("%w: over %d bytes of written files", ErrOverlayTooLarge, maxOverlayTotal)
	}
	data, err := readNoFollow(c.up(p))
	if err != nil {
		return err
	}
	if lst != nil && lst.Mode().IsRegular() && lst.Mode().Perm() == perm && lst.Size() == int64(len(data)) {
		if old, err := readNoFollow(c.low(p)); err == nil && bytes.Equal(old, data) {
			return nil // copied up (touch, chmod back) but unchanged
		}
	}
	c.files = append(c.files, backend.File{Path: p, Mode: perm, Data: data})
	return nil
}

func (c *capturer) dir(p string, perm fs.FileMode, lst fs.FileInfo) error {
	switch {
	case lst == nil || !lst.IsDir():
		if lst != nil {
			c.deleted = append(c.deleted, p) // a file or link replaced by a directory
		}
		c.files = append(c.files, backend.File{Path: p, Mode: fs.ModeDir | perm})
	default:
		if lst.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky) != perm {
			c.files = append(c.files, backend.File{Path: p, Mode: fs.ModeDir | perm})
		}
		if opaque(c.up(p)) {
			// Removed and made again: every entry seen beneath and not
			// in upper is gone.
			names, err := readNames(c.low(p))
			if err != nil {
				return err
			}
			for _, n := range names {
				q := path.Join(p, n)
				if _, err := os.Lstat(c.up(q)); errors.Is(err, fs.ErrNotExist) {
					c.deleted = append(c.deleted, q)
				}
			}
		}
	}
	return c.walk(p, lst != nil && lst.IsDir())
}

func opaque(dir string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(dir, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

func readNoFollow(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if b == nil {
		b = []byte{}
	}
	return b, err
}
