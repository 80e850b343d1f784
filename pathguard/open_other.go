//go:build !linux

package pathguard

import (
	"io/fs"
	"os"
)

// openNoFollow falls back to os.Root alone on systems other than Linux: the
// open still cannot leave the root, but a symlink swapped in at the last
// element is followed (inside the root) instead of refused, and opening a
// FIFO may block.
func openNoFollow(base, rel string) (*os.File, error) {
	if rel == "." {
		return nil, errIsRoot
	}
	r, err := os.OpenRoot(base)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fi, err := r.Lstat(rel)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, errSymlink
	}
	if !fi.Mode().IsRegular() {
		return nil, errSpecial
	}
	return r.Open(rel)
}

// openBeneath has no one-call form here; Open always takes the careful path.
func openBeneath(base, rel string) (*os.File, error) { return nil, errSpecial }
