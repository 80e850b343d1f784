package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/protocol"
)

// ErrExists: the target workspace already exists.
var ErrExists = errors.New("workspace already exists")

// Extract unpacks the tar.gz data into dir, which must not exist yet. On
// any error dir is removed again.
func Extract(data []byte, dir string, lim protocol.ArchiveLimits) (err error) {
	lim = lim.WithDefaults()
	if int64(len(data)) > lim.MaxCompressed {
		return fmt.Errorf("%d compressed bytes, limit %d: %w", len(data), lim.MaxCompressed, protocol.ErrLimit)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("artifact: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("artifact: %s: %w", filepath.Base(dir), ErrExists)
		}
		return fmt.Errorf("artifact: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("artifact: %w", err)
	}
	defer root.Close()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%v: %w", err, protocol.ErrCorrupt)
	}
	// The tar stream itself is bounded too: headers and padding of at most
	// MaxMembers entries cannot need more than this, so a stream of empty
	// padding cannot spin forever.
	budget := protocol.TarBudget(lim.MaxUnpacked, lim.MaxMembers)
	tr := tar.NewReader(io.LimitReader(zr, budget))
	var members int
	var written int64
	var links []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%v: %w", err, protocol.ErrCorrupt)
		}
		members++
		if members > lim.MaxMembers {
			return fmt.Errorf("more than %d members: %w", lim.MaxMembers, protocol.ErrLimit)
		}
		name, err := protocol.CleanName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			return fmt.Errorf("%q: type %q is not a regular file, directory or symlink: %w", hdr.Name, hdr.Typeflag, protocol.ErrUnsafe)
		}
		if name == "." || pathguard.IsReserved(name) {
			if hdr.Typeflag == tar.TypeSymlink && name == "." {
				return fmt.Errorf("%q: the root cannot be a symlink: %w", hdr.Name, protocol.ErrUnsafe)
			}
			continue
		}
		// A member is written where its name leads once the links
		// already extracted are followed ("p -> ." makes "p/.pulse/x"
		// the reserved .pulse/x): that place, not the name, must be
		// outside the reserved directory.
		if err := checkPlace(dir, name); err != nil {
			return err
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("artifact: %q: %w", name, err)
			}
		}
		// Like GNU tar, a member replaces a symlink (or, unless it is a
		// directory, a file) an earlier member left at its name, instead
		// of writing through it.
		existing, err := replaceable(root, name, hdr.Typeflag == tar.TypeDir)
		if err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeSymlink {
			if err := protocol.CheckLinkTarget(name, hdr.Linkname); err != nil {
				return err
			}
			// os.Root creates the link only inside dir, and refuses to
			// follow any link out of it for every later member.
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("artifact: %q: %v: %w", name, err, protocol.ErrUnsafe)
			}
			links = append(links, name)
			// Checked now, before a later member can write through it,
			// and all again at the end, since a later link can change
			// where an earlier one leads.
			if err := checkLink(dir, name); err != nil {
				return err
			}
			continue
		}
		if hdr.Typeflag == tar.TypeDir {
			if existing == fs.ModeDir {
				continue
			}
			if err := root.Mkdir(name, 0o755); err != nil {
				return fmt.Errorf("artifact: %q: %w", name, err)
			}
			continue
		}
		if hdr.Size < 0 || written+hdr.Size > lim.MaxUnpacked {
			return fmt.Errorf("more than %d unpacked bytes: %w", lim.MaxUnpacked, protocol.ErrLimit)
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("artifact: %q: %w", name, err)
			}
		}
		// Only permission bits, and never set-id: the archive decides what
		// is executable, not who it runs as.
		perm := fs.FileMode(hdr.Mode).Perm() | 0o600
		// O_EXCL: whatever was at name is gone (replaceable), so the
		// file is new, and a link made meanwhile is never followed.
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return fmt.Errorf("artifact: %q: %w", name, err)
		}
		n, cerr := io.Copy(f, io.LimitReader(tr, lim.MaxUnpacked-written+1))
		written += n
		if err := f.Close(); cerr == nil {
			cerr = err
		}
		if cerr != nil {
			return fmt.Errorf("artifact: %q: %v: %w", name, cerr, protocol.ErrCorrupt)
		}
		if written > lim.MaxUnpacked {
			return fmt.Errorf("more than %d unpacked bytes: %w", lim.MaxUnpacked, protocol.ErrLimit)
		}
		if err := root.Chmod(name, perm); err != nil {
			return fmt.Errorf("artifact: %q: %w", name, err)
		}
	}
	return checkLinks(dir, links)
}

// checkLinks resolves every extracted symlink for real, following any
// other link on its way, and refuses the archive if one leads out of dir:
// the lexical check alone would miss "c -> a/b/.." where a/b is itself a
// link to "..". Resolution goes component by component, so a target
// that does not exist (a dangling link) is judged too.
func checkLinks(dir string, links []string) error {
	for _, name := range links {
		if fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(name))); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue // replaced by a later member
		}
		if err := checkLink(dir, name); err != nil {
			return err
		}
	}
	return nil
}

// checkLink refuses the link at name when, followed through every link,
// it leads out of dir or into the reserved directory.
func checkLink(dir, name string) error {
	to, err := protocol.Resolve(dir, name)
	if err != nil {
		return err
	}
	if pathguard.IsReserved(to) {
		return fmt.Errorf("%q leads into the reserved %s: %w", name, pathguard.ReservedDir, protocol.ErrUnsafe)
	}
	return nil
}

// checkPlace refuses a member whose name, once the links in its parent
// directories are followed, is in the reserved directory or outside dir.
func checkPlace(dir, name string) error {
	parent, err := protocol.Resolve(dir, path.Dir(name))
	if err != nil {
		return err
	}
	if at := path.Join(parent, path.Base(name)); pathguard.IsReserved(at) {
		return fmt.Errorf("%q is %s through a link: %w", name, at, protocol.ErrUnsafe)
	}
	return nil
}

// replaceable makes room for a member at name: a symlink or a file an
// earlier member left there is removed; a directory is kept for a
// directory member (it returns fs.ModeDir then, else 0) and refuses any
// other member, which would take the tree beneath it.
func replaceable(root *os.Root, name string, isDir bool) (fs.FileMode, error) {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("artifact: %q: %w", name, err)
	}
	if fi.IsDir() {
		if isDir {
			return fs.ModeDir, nil
		}
		return 0, fmt.Errorf("%q: a later member would replace a directory: %w", name, protocol.ErrUnsafe)
	}
	if err := root.Remove(name); err != nil {
		return 0, fmt.Errorf("artifact: %q: %w", name, err)
	}
	return 0, nil
}
