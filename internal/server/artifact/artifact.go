package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
)

// Defaults of the Python server, kept so that clients see the same limits.
const (
	DefaultMaxCompressed int64 = 32 << 20
	DefaultMaxUnpacked   int64 = 512 << 20
	DefaultMaxMembers          = 10_000
)

// ManifestName is the archive member listing deleted paths.
const ManifestName = ".pulse/overlay.json"

// Error classes; test with errors.Is.
var (
	// ErrUnsafe: the archive holds a member that could escape or alias the
	// workspace (absolute, "..", link, device, ...).
	ErrUnsafe = errors.New("unsafe artifact member")
	// ErrLimit: the archive is over a size or member limit.
	ErrLimit = errors.New("artifact over limit")
	// ErrCorrupt: the data is not a gzip-compressed tar.
	ErrCorrupt = errors.New("artifact is not a valid tar.gz")
	// ErrExists: the target workspace already exists.
	ErrExists = errors.New("workspace already exists")
)

// Limits bounds an upload. Zero fields take the defaults.
type Limits struct {
	MaxCompressed int64
	MaxUnpacked   int64
	MaxMembers    int
}

func (l Limits) withDefaults() Limits {
	if l.MaxCompressed <= 0 {
		l.MaxCompressed = DefaultMaxCompressed
	}
	if l.MaxUnpacked <= 0 {
		l.MaxUnpacked = DefaultMaxUnpacked
	}
	if l.MaxMembers <= 0 {
		l.MaxMembers = DefaultMaxMembers
	}
	return l
}

// CleanName validates an archive member name and returns it cleaned and
// slash-separated. Backslashes count as separators, as the Python server
// treated them, so "a\..\..\x" is refused too.
func CleanName(name string) (string, error) {
	n := strings.ReplaceAll(name, "\\", "/")
	if n == "" || strings.ContainsRune(n, 0) || len(n) > pathguard.MaxPathLen {
		return "", fmt.Errorf("%q: %w", name, ErrUnsafe)
	}
	if strings.HasPrefix(n, "/") || (len(n) >= 2 && n[1] == ':') {
		return "", fmt.Errorf("%q: absolute: %w", name, ErrUnsafe)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("%q: parent reference: %w", name, ErrUnsafe)
		}
		if len(part) > pathguard.MaxNameLen {
			return "", fmt.Errorf("%q: name too long: %w", name, ErrUnsafe)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return ".", nil
	}
	return c, nil
}

// Extract unpacks the tar.gz data into dir, which must not exist yet. On
// any error dir is removed again.
func Extract(data []byte, dir string, lim Limits) (err error) {
	lim = lim.withDefaults()
	if int64(len(data)) > lim.MaxCompressed {
		return fmt.Errorf("%d compressed bytes, limit %d: %w", len(data), lim.MaxCompressed, ErrLimit)
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
		return fmt.Errorf("%v: %w", err, ErrCorrupt)
	}
	// The tar stream itself is bounded too: headers and padding of at most
	// MaxMembers entries cannot need more than this, so a stream of empty
	// padding cannot spin forever.
	budget := lim.MaxUnpacked + int64(lim.MaxMembers+2)*3*512
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
			return fmt.Errorf("%v: %w", err, ErrCorrupt)
		}
		members++
		if members > lim.MaxMembers {
			return fmt.Errorf("more than %d members: %w", lim.MaxMembers, ErrLimit)
		}
		name, err := CleanName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			return fmt.Errorf("%q: type %q is not a regular file, directory or symlink: %w", hdr.Name, hdr.Typeflag, ErrUnsafe)
		}
		if name == "." || pathguard.IsReserved(name) {
			if hdr.Typeflag == tar.TypeSymlink && name == "." {
				return fmt.Errorf("%q: the root cannot be a symlink: %w", hdr.Name, ErrUnsafe)
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
			if err := CheckLinkTarget(name, hdr.Linkname); err != nil {
				return err
			}
			// os.Root creates the link only inside dir, and refuses to
			// follow any link out of it for every later member.
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("artifact: %q: %v: %w", name, err, ErrUnsafe)
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
			return fmt.Errorf("more than %d unpacked bytes: %w", lim.MaxUnpacked, ErrLimit)
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
			return fmt.Errorf("artifact: %q: %v: %w", name, cerr, ErrCorrupt)
		}
		if written > lim.MaxUnpacked {
			return fmt.Errorf("more than %d unpacked bytes: %w", lim.MaxUnpacked, ErrLimit)
		}
		if err := root.Chmod(name, perm); err != nil {
			return fmt.Errorf("artifact: %q: %w", name, err)
		}
	}
	return checkLinks(dir, links)
}

// CheckLinkTarget accepts a symlink at name (clean, relative) whose target
// is relative and, read lexically from the link's directory, stays inside
// the workspace and outside the reserved .pulse directory.
func CheckLinkTarget(name, target string) error {
	if target == "" || strings.ContainsRune(target, 0) || strings.Contains(target, "\\") || len(target) > pathguard.MaxPathLen {
		return fmt.Errorf("%q -> %q: bad target: %w", name, target, ErrUnsafe)
	}
	if strings.HasPrefix(target, "/") || (len(target) >= 2 && target[1] == ':') {
		return fmt.Errorf("%q -> %q: absolute target: %w", name, target, ErrUnsafe)
	}
	resolved := path.Join(path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("%q -> %q: target leaves the workspace: %w", name, target, ErrUnsafe)
	}
	if resolved != "." && pathguard.IsReserved(resolved) {
		return fmt.Errorf("%q -> %q: target is reserved: %w", name, target, ErrUnsafe)
	}
	return nil
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
	to, err := resolve(dir, name)
	if err != nil {
		return err
	}
	if pathguard.IsReserved(to) {
		return fmt.Errorf("%q leads into the reserved %s: %w", name, pathguard.ReservedDir, ErrUnsafe)
	}
	return nil
}

// checkPlace refuses a member whose name, once the links in its parent
// directories are followed, is in the reserved directory or outside dir.
func checkPlace(dir, name string) error {
	parent, err := resolve(dir, path.Dir(name))
	if err != nil {
		return err
	}
	if at := path.Join(parent, path.Base(name)); pathguard.IsReserved(at) {
		return fmt.Errorf("%q is %s through a link: %w", name, at, ErrUnsafe)
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
		return 0, fmt.Errorf("%q: a later member would replace a directory: %w", name, ErrUnsafe)
	}
	if err := root.Remove(name); err != nil {
		return 0, fmt.Errorf("artifact: %q: %w", name, err)
	}
	return 0, nil
}

// maxLinkHops bounds link-following, as the kernel's ELOOP does.
const maxLinkHops = 40

// ResolveInside follows the slash-separated relative name inside dir, link
// by link, and reports ErrUnsafe when any step climbs above dir or meets
// an absolute target. A missing component ends nothing: the rest is
// followed lexically.
func ResolveInside(dir, name string) error { return resolveInside(dir, name) }

func resolveInside(dir, name string) error {
	_, err := resolve(dir, name)
	return err
}

// resolve follows name inside dir as ResolveInside does and returns where
// it leads, clean and relative to dir ("." for dir itself).
func resolve(dir, name string) (string, error) {
	var cur []string
	rest := strings.Split(name, "/")
	hops := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return "", fmt.Errorf("%q resolves outside the workspace: %w", name, ErrUnsafe)
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Join(append(cur, c)...)))
		info, err := os.Lstat(p)
		if err != nil || info.Mode()&fs.ModeSymlink == 0 {
			// Missing or not a link: the name stays where it is.
			cur = append(cur, c)
			continue
		}
		hops++
		if hops > maxLinkHops {
			return "", fmt.Errorf("%q: too many links: %w", name, ErrUnsafe)
		}
		target, err := os.Readlink(p)
		if err != nil || strings.HasPrefix(target, "/") {
			return "", fmt.Errorf("%q leads to an absolute or unreadable link: %w", name, ErrUnsafe)
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	if len(cur) == 0 {
		return ".", nil
	}
	return path.Join(cur...), nil
}

// Manifest is the deletions list inside an overlay archive.
type Manifest struct {
	Version int      `json:"version"`
	Deleted []string `json:"deleted"`
}

// Pack writes ov as a tar.gz: every file at its path and the manifest.
// Paths are checked with CleanName and must not be reserved.
func Pack(ov *backend.Overlay) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	// A fixed time keeps archives of equal overlays byte-identical.
	mtime := time.Unix(0, 0)
	files := append([]backend.File(nil), ov.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		name, err := CleanName(f.Path)
		if err != nil || name == "." || pathguard.IsReserved(name) {
			return nil, fmt.Errorf("artifact: overlay path %q: %w", f.Path, ErrUnsafe)
		}
		hdr := &tar.Header{Name: name, Mode: int64(f.Mode.Perm()), ModTime: mtime, Format: tar.FormatPAX}
		switch {
		case f.Mode.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case f.Mode&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(f.Data)
			hdr.Mode = 0o777
		case f.Mode.IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		default:
			return nil, fmt.Errorf("artifact: overlay entry %q has mode %v: %w", f.Path, f.Mode, ErrUnsafe)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("artifact: %w", err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("artifact: %w", err)
			}
		}
	}
	m := Manifest{Version: 1, Deleted: append([]string{}, ov.Deleted...)}
	sort.Strings(m.Deleted)
	mb, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: ManifestName, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mb)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	if _, err := tw.Write(mb); err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	return buf.Bytes(), nil
}
