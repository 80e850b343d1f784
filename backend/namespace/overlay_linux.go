package namespace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
)

// maxOverlayTotal bounds the bytes of all files of one overlay, since the
// whole overlay is returned in memory. A variable so tests can lower it.
var maxOverlayTotal int64 = 4 << 30

// maxOverlayFile bounds one file read back from the upper layer, so that a
// command cannot make the backend allocate without limit.
const maxOverlayFile = 1 << 30 // and never more than maxOverlayTotal

// readOverlay turns the overlayfs upper directory into an Overlay. lower is
// the workspace the command saw. Nothing is followed: symlinks in upper or
// lower are read as links, and lower is only consulted through directories
// that are real directories at every level.
func readOverlay(upper, lower string, hidden hiddenSet) (*backend.Overlay, error) {
	return readOverlayOn(upper, lowerView{dir: lower}, hidden)
}

// readOverlayOn is readOverlay with the pending view the command saw
// over the workspace (lowerView).
func readOverlayOn(upper string, lower lowerView, hidden hiddenSet) (*backend.Overlay, error) {
	return readOverlayKeep(upper, lower, hidden, nil)
}

// streamMin is the size from which a regular file is handed as
// File.Source rather than read into memory, when the request allows it.
// A variable so tests can lower it.
var streamMin int64 = 1 << 20

// readOverlayKeep is readOverlayOn that moves each regular file of at
// least streamMin bytes into keep and hands it as File.Source (keep nil:
// every file is read into Data). The overlay's Release removes keep; on
// error the caller releases keep.
func readOverlayKeep(upper string, lower lowerView, hidden hiddenSet, keep *holder) (*backend.Overlay, error) {
	w := &overlayWalk{hidden: hidden, keep: keep}
	if err := walkUpper(w, upper, lower, ".", true); err != nil {
		return nil, err
	}
	ov := &w.Overlay
	if keep != nil && keep.r != nil {
		ov.SetRelease(keep.release)
	}
	sort.Slice(ov.Files, func(i, j int) bool { return ov.Files[i].Path < ov.Files[j].Path })
	sort.Strings(ov.Deleted)
	return ov, nil
}

// walkUpper records the entries of upper/rel. lowerDir says whether
// lower/rel is a real directory (no symlink on the way).
// overlayWalk is an Overlay being built, with the bytes read so far.
type overlayWalk struct {
	backend.Overlay
	size   int64
	hidden hiddenSet // paths the command was shown as absent
	keep   *holder   // where large files are moved to be handed as Source; nil reads them
}

// holder keeps the large files of one overlay, moved out of the upper
// layer so that the run directory can go as usual. It is a run directory
// of its own, locked while held, so that Reconcile removes it only once
// its owner is gone.
type holder struct {
	b *Backend
	r *run
	n int
}

// take moves the upper file full into the holder and returns its new
// path. The command is gone, so nothing else writes the file.
func (h *holder) take(full string) (string, error) {
	if h.r == nil {
		r, err := h.b.newRun()
		if err != nil {
			return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
		}
		h.r = r
	}
	// Made unreadable by the command (chmod 000)? The upper layer is
	// ours, and the caller keeps the mode it saw. On any error nothing
	// has moved, so the caller can still read full.
	if err := os.Chmod(full, 0o600); err != nil {
		return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
	}
	h.n++
	dst := filepath.Join(h.r.dir, "upper", strconv.Itoa(h.n))
	if err := os.Rename(full, dst); err != nil {
		return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
	}
	return dst, nil
}

// release removes what the holder keeps; nil-safe and idempotent.
func (h *holder) release() {
	if h == nil || h.r == nil {
		return
	}
	r := h.r
	h.r = nil
	if err := r.remove(); err != nil {
		h.b.o.logger.Warn("namespace: removing kept overlay files", slog.String("dir", r.dir), slog.Any("err", err))
	}
}

func walkUpper(ov *overlayWalk, upper string, lower lowerView, rel string, lowerDir bool) error {
	dir := filepath.Join(upper, rel)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrPermission) {
		// The command made the directory unreadable (chmod 000). The
		// upper layer is ours: open it up and read on; the reported mode
		// was taken before.
		if os.Chmod(dir, 0o700) == nil {
			entries, err = os.ReadDir(dir)
		}
	}
	if err != nil {
		return err
	}
	present := make(map[string]bool, len(entries))
	for _, e := range entries {
		name := e.Name()
		present[name] = true
		p := path.Join(rel, name)
		if p == pathguard.ReservedDir {
			// The directory the sandbox hides; the command cannot have
			// written into it. Another case spelling is a directory of
			// the command's own on this case-sensitive upper layer: it
			// is reported, so the facade refuses it (IsReserved)
			// visibly instead of its writes vanishing here.
			continue
		}
		full := filepath.Join(upper, filepath.FromSlash(p))
		st, err := os.Lstat(full)
		if err != nil {
			return err
		}
		lst := lower.lstat(p, lowerDir)
		mode := st.Mode()
		switch {
		case mode.IsRegular():
			if ov.size += st.Size(); ov.size > maxOverlayTotal {
				return fmt.Errorf("%w: over %d bytes of written files", ErrOverlayTooLarge, maxOverlayTotal)
			}
			maybeSame := lst != nil && lst.Mode().IsRegular() && lst.Mode().Perm() == mode.Perm() && lst.Size() == st.Size()
			if ov.keep != nil && st.Size() >= streamMin && !maybeSame {
				// Large and certainly changed: handed by path, never
				// held in memory. (One that may be an unchanged copy-up
				// is read and compared as before.)
				if st.Size() > maxOverlayFile {
					return fmt.Errorf("%w: %s: %d bytes is over the %d byte limit of one overlay file", ErrOverlayTooLarge, full, st.Size(), maxOverlayFile)
				}
				// If it cannot be moved (a directory the command made
				// unwritable, say), it is read as before.
				if src, err := ov.keep.take(full); err == nil {
					ov.Files = append(ov.Files, backend.File{Path: p, Mode: mode.Perm(), Source: src})
					continue
				}
			}
			data, err := readNoFollow(full, st.Size())
			if err != nil {
				return err
			}
			if maybeSame {
				if lower.same(p, data) {
					continue // copied up (touch, chmod back) but unchanged
				}
			}
			ov.Files = append(ov.Files, backend.File{Path: p, Mode: mode.Perm(), Data: data})
		case mode&fs.ModeSymlink != 0:
			t, err := os.Readlink(full)
			if err != nil {
				return err
			}
			if lst != nil && lst.Mode()&fs.ModeSymlink != 0 {
				if lt, err := lower.readlink(p); err == nil && lt == t {
					continue
				}
			}
			ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeSymlink, Data: []byte(t)})
		case mode&fs.ModeCharDevice != 0 && mode&fs.ModeDevice != 0:
			if isWhiteout(st) {
				// A whiteout at a hidden path is the backend's, or the
				// command's removal of what it never saw: not a deletion.
				if lst != nil && !ov.hidden.covers(p) {
					ov.Deleted = append(ov.Deleted, p)
				}
			}
			// Other device nodes cannot be made in the sandbox; ignore.
		case mode.IsDir():
			lowerIsDir := lst != nil && lst.IsDir()
			// wsIsDir: the workspace itself has a real directory there
			// (the pending view may have made one where it has not).
			wsIsDir := lowerIsDir
			if lower.pend != nil {
				wsIsDir = lower.wsDir(p, lowerDir)
			}
			if !lowerIsDir {
				if lst != nil {
					// A file or link replaced by a directory.
					ov.Deleted = append(ov.Deleted, p)
				}
				ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeDir | mode.Perm()})
			} else if isOpaque(full) && !ov.hidden.covers(p) {
				// The directory was removed and made again: every lower
				// entry not in upper is gone.
				if err := opaqueDeletions(ov, upper, lower, p, wsIsDir); err != nil {
					return err
				}
			}
			if err := walkUpper(ov, upper, lower, p, wsIsDir); err != nil {
				return err
			}
		default:
			// FIFOs and sockets are not workspace content.
		}
	}
	return nil
}

func opaqueDeletions(ov *overlayWalk, upper string, lower lowerView, rel string, wsDir bool) error {
	names, err := lower.list(rel, wsDir)
	if err != nil {
		return fmt.Errorf("listing lower %s: %w", rel, err)
	}
	for _, name := range names {
		p := path.Join(rel, name)
		if _, err := os.Lstat(filepath.Join(upper, filepath.FromSlash(p))); errors.Is(err, fs.ErrNotExist) {
			ov.Deleted = append(ov.Deleted, p)
		}
	}
	return nil
}

// isWhiteout reports an overlayfs whiteout: a character device 0/0.
func isWhiteout(st fs.FileInfo) bool {
	s, ok := st.Sys().(*syscall.Stat_t)
	return ok && s.Rdev == 0
}

// isOpaque reports an overlayfs opaque directory. With userxattr (user
// namespaces) the mark is user.overlay.opaque, otherwise
// trusted.overlay.opaque; only "y" means opaque ("x" marks a directory that
// merely holds whiteouts).
func isOpaque(dir string) bool {
	for _, name := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		buf := make([]byte, 8)
		n, err := unix.Lgetxattr(dir, name, buf)
		if err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

func readNoFollow(p string, size int64) ([]byte, error) {
	if size > maxOverlayFile {
		return nil, fmt.Errorf("%w: %s: %d bytes is over the %d byte limit of one overlay file", ErrOverlayTooLarge, p, size, maxOverlayFile)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrPermission) {
		// Made unreadable by the command (chmod 000); the caller keeps
		// the mode it saw, and the upper layer is ours to open up. No
		// process of the sandbox is left to swap p for a symlink.
		if os.Chmod(p, 0o600) == nil {
			f, err = os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxOverlayFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxOverlayFile {
		return nil, fmt.Errorf("%w: %s: over the %d byte limit of one overlay file", ErrOverlayTooLarge, p, maxOverlayFile)
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

func sameContent(p string, data []byte) (bool, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf, err := io.ReadAll(io.LimitReader(f, int64(len(data))+1))
	if err != nil {
		return false, err
	}
	return bytes.Equal(buf, data), nil
}
