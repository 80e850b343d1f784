package sandbox

import (
	"io/fs"
	"sort"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/pathguard"
)

// fileStamp is what the in-place scan compares: enough to notice a
// rewrite without reading file contents.
type fileStamp struct {
	size  int64
	mtime time.Time
	mode  fs.FileMode
	ino   uint64
	ctime syscall.Timespec
}

// scanTree records a stamp for every entry under root except .pulse/. It is
// used only for backends that write in place (the host backend), so that
// the facade can say which files a command changed.
func scanTree(root string) (map[string]fileStamp, error) {
	out := make(map[string]fileStamp)
	err := pathguard.WalkWorkspace(root, func(rel, _ string, d fs.DirEntry, err error) error {
		if err != nil {
			// An entry that vanished or cannot be read mid-walk is
			// reported as absent rather than failing the whole scan.
			return nil
		}
		info, ierr := d.Info()
		if ierr != nil {
			return nil
		}
		st := fileStamp{size: info.Size(), mtime: info.ModTime(), mode: info.Mode()}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			st.ino = sys.Ino
			st.ctime = ctimeOf(sys)
		}
		if info.IsDir() {
			// A directory's size and times change with its entries,
			// which are reported on their own.
			st.size, st.mtime, st.ctime = 0, time.Time{}, syscall.Timespec{}
		}
		out[rel] = st
		return nil
	})
	return out, err
}

// diffScans returns the paths created or changed, and those deleted,
// between two scans, each sorted.
func diffScans(before, after map[string]fileStamp) (changed, deleted []string) {
	for p, a := range after {
		if b, ok := before[p]; !ok || b != a {
			changed = append(changed, p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			deleted = append(deleted, p)
		}
	}
	sort.Strings(changed)
	sort.Strings(deleted)
	return changed, deleted
}
