package cowfs

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
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/pathguard"
)

// Entry types as a snapshot spells them. The empty string means absent.
const (
	typeAbsent  = ""
	typeFile    = "file"
	typeDir     = "dir"
	typeSymlink = "symlink"
	typeOther   = "other" // FIFO, socket, device: never staged over
)

// maxPathLen and maxNameLen match Linux PATH_MAX and NAME_MAX.
const (
	maxPathLen = 4096
	maxNameLen = 255
)

// snapshot is what cowfs knows of one workspace entry at one moment: its
// identity (inode, device), metadata and a SHA-256 of its content (of the
// target, for a symlink). Directories are compared by identity and mode
// only, because their size and mtime change whenever a child does.
type snapshot struct {
	Type    string `json:"type,omitempty"`
	Ino     uint64 `json:"ino,omitempty"`
	Dev     uint64 `json:"dev,omitempty"`
	Size    int64  `json:"size,omitempty"`
	MtimeNS int64  `json:"mtime_ns,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`
	SHA     string `json:"sha256,omitempty"`
	Target  string `json:"target,omitempty"`
}

// compare returns "" when got is the entry want describes, else the
// conflict reason. The content hash is always compared, never skipped on
// equal metadata: a same-size write within one mtime tick is still seen.
func compare(want, got snapshot) string {
	switch {
	case want.Type == typeAbsent && got.Type == typeAbsent:
		return ""
	case want.Type == typeAbsent:
		return ReasonCreated
	case got.Type == typeAbsent:
		return ReasonDeleted
	case want.Type != got.Type || want.Ino != got.Ino:
		// Not the device number: a file system that comes back under
		// another one (a reboot, a loop or overlay mount) holds the same
		// files. Inode, metadata and content still have to match.
		return ReasonReplaced
	case want.Mode != got.Mode:
		return ReasonModified
	}
	switch want.Type {
	case typeFile:
		if want.Size != got.Size || want.MtimeNS != got.MtimeNS || want.SHA != got.SHA {
			return ReasonModified
		}
	case typeSymlink:
		if want.Target != got.Target {
			return ReasonModified
		}
	}
	return ""
}

// dirMadeMeanwhile reports whether c, a staged directory, is one the
// workspace holds by now as a directory that Commit may write into
// instead of a conflict: an implicit one (staged for a path beneath it),
// or one a command made where there was nothing (what `mkdir d` in the
// workspace did too). A file or symlink there, or a directory that c
// changes the mode of, is still compared with the snapshot.
func dirMadeMeanwhile(c *change, cur snapshot) bool {
	return c.Kind == KindMkdir && cur.Type == typeDir && (c.Implicit || c.Before.Type == typeAbsent)
}

// cleanRel turns a caller's path into the slash-separated, clean,
// workspace-relative key cowfs uses everywhere. It is purely lexical: the
// entries on the way are checked against the disk when a change is staged
// and again when it is committed. This is the one place user paths enter.
func cleanRel(root, p string) (string, error) {
	bad := func(why string) error { return fmt.Errorf("%w: %q: %s", ErrInvalidPath, p, why) }
	switch {
	case p == "":
		return "", bad("empty")
	case strings.IndexByte(p, 0) >= 0:
		return "", bad("NUL byte")
	case len(p) > maxPathLen:
		return "", bad("too long")
	}
	p = filepath.ToSlash(p)
	if path.IsAbs(p) {
		r := filepath.ToSlash(root)
		if p != r && !strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
			return "", bad("outside the workspace")
		}
		p = strings.TrimPrefix(p, strings.TrimSuffix(r, "/"))
	}
	c := path.Clean("/" + p)
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", bad("contains ..")
		}
	}
	c = strings.TrimPrefix(c, "/")
	if c == "" || c == "." {
		return "", bad("names the workspace root")
	}
	for _, name := range strings.Split(c, "/") {
		if len(name) > maxNameLen {
			return "", bad("name too long")
		}
	}
	if isReserved(c) {
		return "", bad("under the reserved .pulse directory")
	}
	return c, nil
}

// isReserved reports whether the clean relative path rel is .pulse or
// under it (case-insensitively, so a case-folding file system cannot
// alias it). pathguard owns that rule for the whole project.
func isReserved(rel string) bool { return pathguard.IsReserved(rel) }

// checkLinkTarget refuses symlink targets that could lead a reader
// outside the workspace or into .pulse once written at rel. The rule is
// pathguard's (CheckLinkTarget says why it is on the target's elements
// and not its cleaned form); cowfs keeps its half of the bargain by
// committing a link only where its ancestors are real directories.
func checkLinkTarget(rel, target string) error {
	if err := pathguard.CheckLinkTarget(rel, target); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPath, err)
	}
	return nil
}

// linkLeaves reports whether the symlink at rel with target leads
// outside the workspace when followed from rel's directory, judged
// lexically (an absolute target always does).
func linkLeaves(rel, target string) bool {
	if path.IsAbs(target) {
		return true
	}
	j := path.Join(path.Dir(rel), target)
	return j == ".." || strings.HasPrefix(j, "../")
}

// ancestors returns the proper ancestors of rel, outermost first.
func ancestors(rel string) []string {
	var out []string
	for i := 0; i < len(rel); i++ {
		if rel[i] == '/' {
			out = append(out, rel[:i])
		}
	}
	return out
}

func depth(rel string) int { return strings.Count(rel, "/") }

// workspace is the workspace directory seen through an os.Root, so no
// operation can leave it whatever symlinks it holds.
type workspace struct {
	dir  string // absolute, symlinks resolved
	root *os.Root
	// top is the workspace directory opened through root, kept for the
	// raw-descriptor paths (rawfd.go); topFD is its descriptor.
	top   *os.File
	topFD int
	// topMu is held (read) while topFD is in use, and (write) to close
	// it; topClosed says it was.
	topMu     sync.RWMutex
	topClosed bool
}

// close releases the workspace's descriptors.
func (w *workspace) close() error {
	w.topMu.Lock()
	if !w.topClosed {
		w.topClosed = true
		w.top.Close()
	}
	w.topMu.Unlock()
	return w.root.Close()
}

func openWorkspace(dir string) (*workspace, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("cowfs: workspace: %w", err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("cowfs: workspace: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("cowfs: workspace %s is not a directory", real)
	}
	r, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("cowfs: workspace: %w", err)
	}
	top, err := r.Open(".")
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("cowfs: workspace: %w", err)
	}
	return &workspace{dir: real, root: r, top: top, topFD: int(top.Fd())}, nil
}

// statSnap is the snapshot of fi (no content hash). Every FileInfo cowfs
// gets comes from lstat or fstat and carries a Stat_t; one that does not
// (from another fs.FS) gives its type and size only, with no mode, inode,
// device or time to match a later stat by.
func statSnap(fi fs.FileInfo) snapshot {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return sysSnap(st)
	}
	s := snapshot{Type: typeOther}
	switch {
	case fi.Mode().IsRegular():
		s.Type = typeFile
	case fi.IsDir():
		s.Type = typeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		s.Type = typeSymlink
	}
	if s.Type == typeFile {
		s.Size = fi.Size()
	}
	return s
}

// sysSnap is statSnap of what stat(2) returned.
func sysSnap(st *syscall.Stat_t) snapshot {
	return newSnap(uint32(st.Mode), st.Ino, uint64(st.Dev), st.Size, mtimeNS(st))
}

// newSnap is the snapshot of a stat's fields (no content hash).
func newSnap(mode uint32, ino, dev uint64, size, mtimeNS int64) snapshot {
	s := snapshot{Type: typeOther, Ino: ino, Dev: dev, MtimeNS: mtimeNS, Mode: mode & 0o7777}
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		s.Type = typeFile
		s.Size = size
	case syscall.S_IFDIR:
		s.Type = typeDir
	case syscall.S_IFLNK:
		s.Type = typeSymlink
	}
	return s
}

func isNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// lstat is Lstat of the literal path rel: if any ancestor is not a real
// directory (a symlink, a file), rel does not exist as far as cowfs is
// concerned, so a snapshot, a walk or a removal never reaches through a
// symlinked directory to what it points at.
func (w *workspace) lstat(rel string) (fs.FileInfo, error) {
	for _, a := range ancestors(rel) {
		fi, err := w.root.Lstat(a)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, &fs.PathError{Op: "lstat", Path: rel, Err: syscall.ENOTDIR}
		}
	}
	return w.root.Lstat(rel)
}

// snap records the entry at rel without following a final symlink. For a
// regular file it reads the whole content to hash it and, when copy is not
// nil, copies it there in the same pass (copy is rewound on a retry).
func (w *workspace) snap(rel string, copy *os.File) (snapshot, error) {
	for attempt := 0; ; attempt++ {
		st, err := w.lstatSys(rel)
		if isNotExist(err) {
			return snapshot{}, nil
		}
		if err != nil {
			return snapshot{}, err
		}
		s := unixSnap(&st)
		switch s.Type {
		case typeSymlink:
			t, err := w.root.Readlink(rel)
			if err != nil {
				if isNotExist(err) && attempt < 3 {
					continue
				}
				return snapshot{}, err
			}
			s.Target = t
			sum := sha256.Sum256([]byte(t))
			s.SHA = hex.EncodeToString(sum[:])
			return s, nil
		case typeFile:
		default:
			return s, nil
		}
		stable, err := w.hashFile(rel, &s, copy)
		if err != nil {
			return snapshot{}, err
		}
		if stable {
			return s, nil
		}
		if attempt >= 3 {
			// Still changing under us: report what we saw last; the
			// comparison with the staged snapshot will call it modified.
			return s, nil
		}
	}
}

// hashFile fills s.SHA from the file at rel. It reports false when the
// file was swapped or written while it was read, so the caller retries.
// The file is opened O_NONBLOCK, so that a FIFO put there since the
// lstat does not block the open, and is read only if it is the regular
// file the lstat saw; raw descriptors (rawfd.go), as it is opened for
// every file a commit replaces, three times.
func (w *workspace) hashFile(rel string, s *snapshot, copy *os.File) (bool, error) {
	dir, release, err := w.dirFD(path.Dir(rel))
	if isNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer release()
	fd, err := openat(dir, path.Base(rel), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	err = pathErr("open", rel, err)
	if isNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	got, err := fstatSnap(fd)
	if err != nil {
		return false, pathErr("stat", rel, err)
	}
	if got.Type != typeFile || got.Ino != s.Ino || got.Dev != s.Dev {
		return false, nil
	}
	if copy != nil {
		if err := copy.Truncate(0); err != nil {
			return false, err
		}
		if _, err := copy.Seek(0, io.SeekStart); err != nil {
			return false, err
		}
	}
	var out func([]byte) error
	if copy != nil {
		out = func(b []byte) error { _, err := copy.Write(b); return err }
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	h := sha256.New()
	if _, err := copyHash(h, out, fdReader(fd), *buf); err != nil {
		return false, pathErr("read", rel, err)
	}
	after, err := fstatSnap(fd)
	if err != nil {
		return false, pathErr("stat", rel, err)
	}
	if after.Size != s.Size || after.MtimeNS != s.MtimeNS || after.Mode != s.Mode {
		*s = after
		return false, nil
	}
	s.SHA = hex.EncodeToString(h.Sum(nil))
	return true, nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
