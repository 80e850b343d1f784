//go:build linux

package gvisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// An execution's directory, under the state dir, is named execPrefix and
// the container id; it holds:
//
//	lock      flocked while the execution lives (Reconcile spares it)
//	layer/    the pending view, hidden paths and .pulse as one lower layer
//	ws/       the workspace, bound read-only
//	scratch/  a tmpfs of the disk bound: upper/ and work/ of the overlay
//	merged/   the overlay the command sees at the workspace's path
//	lower/    the same lower layers read-only: what the command saw
//	rootfs/   the sandbox's empty root, with its mount points
//	empty     an empty file bound over masked files
//	config.json  the OCI bundle's spec
const (
	execPrefix = "x-"
	lockName   = "lock"
)

// view is one execution's mounts.
type view struct {
	dir     string
	merged  string
	lower   string
	upper   string
	scratch string
}

// mountView builds the layer and mounts the workspace view of req in dir,
// the overlay the command sees at merged (dir/merged when ""). On an
// error, what it mounted is left for teardown.
func mountView(dir, merged string, req *backend.Request, diskBytes int64) (*view, error) {
	if merged == "" {
		merged = filepath.Join(dir, "merged")
	}
	v := &view{dir: dir, merged: merged, lower: filepath.Join(dir, "lower"),
		scratch: filepath.Join(dir, "scratch")}
	v.upper = filepath.Join(v.scratch, "upper")
	layer, wsb := filepath.Join(dir, "layer"), filepath.Join(dir, "ws")
	for _, d := range []string{layer, wsb, v.scratch, v.merged, v.lower} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := buildLayer(layer, req); err != nil {
		return nil, err
	}
	if err := unix.Mount(req.Workspace, wsb, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return nil, fmt.Errorf("bind workspace: %w", err)
	}
	if err := unix.Mount("", wsb, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
		return nil, fmt.Errorf("workspace read-only: %w", err)
	}
	if diskBytes <= 0 {
		var st unix.Statfs_t
		free := int64(-1)
		if unix.Statfs(dir, &st) == nil {
			free = int64(st.Bavail) * st.Bsize
		}
		diskBytes = policy.DiskDefault(free)
	}
	// An inode bound to match, so that empty files cannot fill memory
	// either (one inode per 4 KiB, as tmpfs's own default ratio is far
	// more generous).
	inodes := max(diskBytes/4096, 1024)
	if err := unix.Mount("tmpfs", v.scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
		"mode=0700,size="+strconv.FormatInt(diskBytes, 10)+",nr_inodes="+strconv.FormatInt(inodes, 10)); err != nil {
		return nil, fmt.Errorf("scratch tmpfs: %w", err)
	}
	work := filepath.Join(v.scratch, "work")
	for _, d := range []string{v.upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	// The upper directory's root is the workspace root's mode as seen.
	if st, err := os.Stat(req.Workspace); err == nil {
		_ = os.Chmod(v.upper, st.Mode().Perm())
	}
	// Upper files must hold their data and plain names: metacopy would
	// leave data in the lower layers and redirect_dir would hide renames
	// in xattrs the capture does not read.
	const fixed = ",redirect_dir=off,metacopy=off,index=off,xino=off"
	lowers := "lowerdir=" + layer + ":" + wsb
	if err := unix.Mount("overlay", v.lower, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, lowers+fixed); err != nil {
		return nil, fmt.Errorf("lower view overlay: %w", err)
	}
	if err := unix.Mount("overlay", v.merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV,
		lowers+",upperdir="+v.upper+",workdir="+work+fixed); err != nil {
		return nil, fmt.Errorf("workspace overlay: %w", err)
	}
	return v, nil
}

// buildLayer writes req's pending view into dir, then whiteouts for the
// hidden paths and .pulse, which the command must not see whatever the
// stack holds there.
func buildLayer(dir string, req *backend.Request) error {
	ws := req.Workspace
	if p := req.Pending; !p.Empty() {
		if err := backend.CheckPending(p); err != nil {
			return err
		}
		for i := range p.View {
			if err := writeEntry(dir, ws, &p.View[i]); err != nil {
				return fmt.Errorf("pending %s: %w", p.View[i].Path, err)
			}
		}
	}
	for _, h := range append(req.Hidden, pathguard.ReservedDir) {
		if coveredAbove(dir, h) {
			continue // beneath a deletion, file or symlink: not shown at all
		}
		full := filepath.Join(dir, filepath.FromSlash(h))
		if err := os.RemoveAll(full); err != nil {
			return err
		}
		if err := parents(dir, ws, h); err != nil {
			return err
		}
		if err := whiteout(full); err != nil {
			return fmt.Errorf("hide %s: %w", h, err)
		}
	}
	return nil
}

// writeEntry puts one pending entry into the layer.
func writeEntry(dir, ws string, e *backend.PendingEntry) error {
	if e.Path == "" || e.Path == "." || path.Clean(e.Path) != e.Path || strings.HasPrefix(e.Path, "../") || path.IsAbs(e.Path) {
		return fmt.Errorf("%w: pending path %q", backend.ErrInvalidRequest, e.Path)
	}
	if e.Kind == backend.PendingDeleted && coveredAbove(dir, e.Path) {
		return nil // beneath a deletion of its own: hidden already
	}
	if err := parents(dir, ws, e.Path); err != nil {
		return err
	}
	full := filepath.Join(dir, filepath.FromSlash(e.Path))
	if e.Kind != backend.PendingDir {
		if err := os.RemoveAll(full); err != nil {
			return err
		}
	}
	switch e.Kind {
	case backend.PendingFile:
		rc, err := e.Open()
		if err != nil {
			return err
		}
		defer rc.Close()
		f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, rc); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Chmod(full, e.Mode&fs.ModePerm)
	case backend.PendingDir:
		st, err := os.Lstat(full)
		if err == nil && !st.IsDir() {
			if err := os.Remove(full); err != nil {
				return err
			}
		}
		if err := os.Mkdir(full, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return os.Chmod(full, e.Mode&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky))
	case backend.PendingSymlink:
		return os.Symlink(e.Target, full)
	case backend.PendingDeleted:
		return whiteout(full)
	}
	return fmt.Errorf("%w: pending entry kind %d", backend.ErrInvalidRequest, e.Kind)
}

// coveredAbove reports whether the layer has something other than a
// directory above rel (a whiteout, a file, a symlink): rel is then not in
// the view, whatever is beneath.
func coveredAbove(dir, rel string) bool {
	for p := path.Dir(rel); p != "."; p = path.Dir(p) {
		if st, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p))); err == nil && !st.IsDir() {
			return true
		}
	}
	return false
}

// parents makes the directories above rel in the layer that are not
// there yet. An overlayfs directory present in several layers shows the
// top one's mode, so each takes the mode the workspace gives it.
func parents(dir, ws, rel string) error {
	parent := path.Dir(rel)
	if parent == "." {
		return nil
	}
	if st, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(parent))); err == nil {
		if st.IsDir() {
			return nil
		}
		// A file, symlink or whiteout of this layer above an entry the
		// view shows: the view lists a directory it makes there before
		// its children, so this does not happen with a valid view; the
		// entry wins.
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(parent))); err != nil {
			return err
		}
	}
	if err := parents(dir, ws, parent); err != nil {
		return err
	}
	mode := fs.FileMode(0o755)
	if st, err := os.Lstat(filepath.Join(ws, filepath.FromSlash(parent))); err == nil && st.IsDir() {
		mode = st.Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeSticky)
	}
	full := filepath.Join(dir, filepath.FromSlash(parent))
	if err := os.Mkdir(full, 0o700); err != nil {
		return err
	}
	return os.Chmod(full, mode)
}

// whiteout makes an overlayfs whiteout: a character device 0/0.
func whiteout(full string) error {
	return unix.Mknod(full, unix.S_IFCHR, 0)
}
