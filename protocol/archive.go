package protocol

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

// Limits of an upload, the Python server's, kept so that clients see the
// same ones.
const (
	DefaultMaxCompressed int64 = 32 << 20
	DefaultMaxUnpacked   int64 = 512 << 20
	DefaultMaxMembers          = 10_000
)

// ManifestName is the overlay archive member listing deleted paths. It
// lives under the reserved .pulse/ directory, where no overlay entry can
// be, so it never collides with a file the command wrote.
const ManifestName = ".pulse/overlay.json"

// ManifestVersion is the one version of the manifest.
const ManifestVersion = 1

// Error classes of archives; test with errors.Is.
var (
	// ErrUnsafe: the archive holds a member that could escape or alias the
	// workspace (absolute, "..", link, device, ...).
	ErrUnsafe = errors.New("unsafe artifact member")
	// ErrLimit: the archive is over a size or member limit.
	ErrLimit = errors.New("artifact over limit")
	// ErrCorrupt: the data is not a gzip-compressed tar of the expected
	// shape.
	ErrCorrupt = errors.New("artifact is not a valid tar.gz")
)

// ArchiveLimits bounds an archive. Zero fields take the defaults.
type ArchiveLimits struct {
	MaxCompressed int64
	MaxUnpacked   int64
	MaxMembers    int
}

// WithDefaults fills zero fields with the defaults.
func (l ArchiveLimits) WithDefaults() ArchiveLimits {
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

// TarBudget bounds the tar stream of an archive of at most unpacked bytes
// of content in members entries: headers and padding cannot need more, so
// a stream of empty blocks cannot run on.
func TarBudget(unpacked int64, members int) int64 {
	return unpacked + int64(members+2)*3*512
}

// CleanName validates an upload member name and returns it cleaned and
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

// CheckLinkTarget accepts a symlink at name (clean, relative) whose target
// pathguard.CheckLinkTarget accepts: the project's one rule, which judges
// the target's elements as written rather than its cleaned form (see
// there), so it stays inside the workspace and outside .pulse. An upload
// must also pass Resolve for every link (a later link can change where an
// earlier one leads).
func CheckLinkTarget(name, target string) error {
	if err := pathguard.CheckLinkTarget(name, target); err != nil {
		return fmt.Errorf("%q: %w: %w", name, ErrUnsafe, err)
	}
	return nil
}

// maxLinkHops bounds link-following, as the kernel's ELOOP does.
const maxLinkHops = 40

// Resolve follows the slash-separated relative name inside the directory
// dir, link by link, and returns where it leads, clean and relative to dir
// ("." for dir itself). It reports ErrUnsafe when any step climbs above
// dir or meets an absolute target. A missing component ends nothing: the
// rest is followed lexically, so a dangling link is judged too.
func Resolve(dir, name string) (string, error) {
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

// Manifest is the deletions list inside an overlay archive:
//
//	{"version": 1, "deleted": ["old.txt", "dir/gone"]}
type Manifest struct {
	Version int      `json:"version"`
	Deleted []string `json:"deleted"`
}

// PackOverlay writes ov as the overlay archive of download_artifact: a
// tar.gz holding every file at its path, sorted, with mtime 0 (equal
// overlays give equal archives), then the manifest. Paths are checked
// with CleanName and must not be reserved.
func PackOverlay(ov *backend.Overlay) ([]byte, error) {
	var buf bytes.Buffer
	zw := NewGzipWriter(&buf, gzip.DefaultCompression)
	tw := tar.NewWriter(zw)
	mtime := time.Unix(0, 0)
	files := append([]backend.File(nil), ov.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		name, err := CleanName(f.Path)
		if err != nil || name == "." || pathguard.IsReserved(name) {
			return nil, fmt.Errorf("protocol: overlay path %q: %w", f.Path, ErrUnsafe)
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
			return nil, fmt.Errorf("protocol: overlay entry %q has mode %v: %w", f.Path, f.Mode, ErrUnsafe)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("protocol: %w", err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("protocol: %w", err)
			}
		}
	}
	m := Manifest{Version: ManifestVersion, Deleted: append([]string{}, ov.Deleted...)}
	sort.Strings(m.Deleted)
	mb, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: ManifestName, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mb)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("protocol: %w", err)
	}
	if _, err := tw.Write(mb); err != nil {
		return nil, fmt.Errorf("protocol: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("protocol: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("protocol: %w", err)
	}
	return buf.Bytes(), nil
}

// OverlayLimits bounds an overlay archive a client accepts.
type OverlayLimits struct {
	// Bytes bounds file contents and link targets together.
	Bytes   int64
	Members int
}

// cleanOverlayMember validates a member name of an overlay archive and
// returns it clean and slash-separated. It is stricter than CleanName,
// since the archive comes from the server and nothing requires leniency:
// absolute names, "..", backslashes, NUL and over-long names are refused.
func cleanOverlayMember(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	if n == "" || len(n) > pathguard.MaxPathLen || strings.ContainsAny(n, "\x00\\") || strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("member %q: %w", name, ErrUnsafe)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." || len(part) > pathguard.MaxNameLen {
			return "", fmt.Errorf("member %q: %w", name, ErrUnsafe)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", fmt.Errorf("member %q: %w", name, ErrUnsafe)
	}
	return c, nil
}

// UnpackOverlay parses an overlay archive (download_artifact). Files come
// back byte-exact with their permission bits (never set-id), directories
// and symlinks by type; the manifest lists deletions. Any member that is
// unsafe, duplicated, reserved or over a limit fails the whole archive,
// with ErrUnsafe, ErrLimit or ErrCorrupt.
func UnpackOverlay(data []byte, lim OverlayLimits) (*backend.Overlay, error) {
	bad := func(class error, format string, args ...any) error {
		return fmt.Errorf("protocol: overlay: %s: %w", fmt.Sprintf(format, args...), class)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, bad(ErrCorrupt, "not gzip: %v", err)
	}
	tr := tar.NewReader(io.LimitReader(zr, TarBudget(lim.Bytes, lim.Members)))
	ov := &backend.Overlay{}
	seen := map[string]bool{}
	var total int64
	members := 0
	manifest := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, bad(ErrCorrupt, "%v", err)
		}
		members++
		if members > lim.Members {
			return nil, bad(ErrLimit, "more than %d members", lim.Members)
		}
		name, err := cleanOverlayMember(hdr.Name)
		if err != nil {
			return nil, bad(ErrUnsafe, "%v", err)
		}
		if hdr.Size < 0 || total+hdr.Size > lim.Bytes {
			return nil, bad(ErrLimit, "more than %d bytes", lim.Bytes)
		}
		if name == ManifestName {
			if manifest || hdr.Typeflag != tar.TypeReg {
				return nil, bad(ErrCorrupt, "second or non-file manifest")
			}
			manifest = true
			body, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
			if err != nil {
				return nil, bad(ErrCorrupt, "manifest: %v", err)
			}
			total += int64(len(body))
			var m Manifest
			if err := json.Unmarshal(body, &m); err != nil || m.Version != ManifestVersion {
				return nil, bad(ErrCorrupt, "manifest is not version 1 JSON")
			}
			for _, d := range m.Deleted {
				c, err := cleanOverlayMember(d)
				if err != nil {
					return nil, bad(ErrUnsafe, "deletion: %v", err)
				}
				if pathguard.IsReserved(c) || seen["-"+c] {
					return nil, bad(ErrUnsafe, "deletion %q reserved or repeated", d)
				}
				seen["-"+c] = true
				ov.Deleted = append(ov.Deleted, c)
			}
			continue
		}
		if pathguard.IsReserved(name) {
			return nil, bad(ErrUnsafe, "member %q is under %s/", name, pathguard.ReservedDir)
		}
		if seen[name] {
			return nil, bad(ErrUnsafe, "member %q repeated", name)
		}
		seen[name] = true
		perm := fs.FileMode(hdr.Mode).Perm()
		f := backend.File{Path: name}
		switch hdr.Typeflag {
		case tar.TypeReg:
			body, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
			if err != nil || int64(len(body)) != hdr.Size {
				return nil, bad(ErrCorrupt, "member %q truncated", name)
			}
			total += hdr.Size
			f.Mode, f.Data = perm, body
		case tar.TypeDir:
			f.Mode = fs.ModeDir | perm
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) || len(hdr.Linkname) > pathguard.MaxPathLen {
				return nil, bad(ErrUnsafe, "symlink %q has a bad target", name)
			}
			total += int64(len(hdr.Linkname))
			f.Mode, f.Data = fs.ModeSymlink|0o777, []byte(hdr.Linkname)
		default:
			return nil, bad(ErrUnsafe, "member %q has type %q", name, hdr.Typeflag)
		}
		ov.Files = append(ov.Files, f)
	}
	if !manifest {
		return nil, bad(ErrCorrupt, "no deletions manifest")
	}
	return ov, nil
}
