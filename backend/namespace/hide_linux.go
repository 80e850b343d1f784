package namespace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
)

// Hidden paths (Request.Hidden) are taken out of the command's view by
// the overlay itself: before the init mounts it, the backend puts a
// whiteout at each hidden path in the upper layer, so the path reads as
// absent, exactly as if the command had deleted it. Nothing is mounted
// over it, so what the command then writes there lands in the upper layer
// and is captured as usual. readOverlay knows the hidden set: a whiteout
// there is not a deletion, and a directory the command creates there does
// not delete the real one's entries, which the command never saw.

// hiddenSet is the cleaned hidden paths of a request.
type hiddenSet map[string]bool

// checkHidden validates req.Hidden against the workspace and returns the
// paths to put whiteouts at: those that exist, and those that do not yet
// but whose directory does (the facade hides a path denied by its full
// name ahead of time: the overlay's lower layer is the live workspace,
// and a file made there while the command runs would show through). A
// path must be clean, relative, outside .pulse, and reached through real
// directories only: a whiteout below a symlinked directory would turn
// the link into a directory in the command's view.
func checkHidden(ws string, hidden []string) (hiddenSet, error) {
	if len(hidden) == 0 {
		return nil, nil
	}
	set := hiddenSet{}
	for _, h := range hidden {
		if !pathguard.IsWorkspacePath(h) || strings.IndexByte(h, '\\') >= 0 {
			return nil, fmt.Errorf("%w: hidden path %q is not a clean workspace path outside .pulse", backend.ErrInvalidRequest, h)
		}
		parts := strings.Split(h, "/")
		p := ws
		exists := true
		for i, part := range parts {
			p = filepath.Join(p, part)
			st, err := os.Lstat(p)
			if errors.Is(err, fs.ErrNotExist) {
				// Missing itself, beneath real directories: hidden ahead.
				exists = i == len(parts)-1
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%w: hidden path %q: %v", backend.ErrInvalidRequest, h, err)
			}
			if i < len(parts)-1 && !st.IsDir() {
				if st.Mode()&fs.ModeSymlink != 0 {
					return nil, fmt.Errorf("%w: hidden path %q lies below a symlink, which the sandbox cannot hide it behind", backend.ErrUnsupported, h)
				}
				exists = false
				break
			}
		}
		if exists {
			set[h] = true
		}
	}
	return set, nil
}

// writeWhiteouts puts a whiteout for each hidden path into upper, making
// the directories above it (with the workspace's modes) as overlayfs
// would on a copy-up. A path below another hidden one needs none.
func writeWhiteouts(upper, ws string, set hiddenSet) error {
	paths := make([]string, 0, len(set))
	for p := range set {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if set.covers(path.Dir(p)) {
			continue
		}
		dir := path.Dir(p)
		if dir != "." {
			cur := ""
			for _, part := range strings.Split(dir, "/") {
				cur = path.Join(cur, part)
				dst := filepath.Join(upper, filepath.FromSlash(cur))
				if _, err := os.Lstat(dst); err == nil {
					continue
				}
				st, err := os.Stat(filepath.Join(ws, filepath.FromSlash(cur)))
				if err != nil {
					return fmt.Errorf("hiding %s: %w", p, err)
				}
				if err := os.Mkdir(dst, st.Mode().Perm()|0o700); err != nil {
					return fmt.Errorf("hiding %s: %w", p, err)
				}
				_ = os.Chmod(dst, st.Mode().Perm()) // Mkdir applied the umask
			}
		}
		if err := unix.Mknod(filepath.Join(upper, filepath.FromSlash(p)), unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("hiding %s: whiteout: %w", p, err)
		}
	}
	return nil
}

// covers reports whether p or a directory above it is hidden.
func (s hiddenSet) covers(p string) bool {
	for ; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if s[p] {
			return true
		}
	}
	return false
}
