package sandbox

import (
	"sort"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/capture"
)

// fileStamp is what the in-place scan compares: enough to notice a
// rewrite without reading file contents.
type fileStamp struct {
	size  int64
	mtime int64 // ns
	mode  uint32
	ino   uint64
	ctime int64 // ns
}

// scanTree records a stamp for every entry under root except .pulse/. It is
// used only for backends that write in place (the host backend), so that
// the facade can say which files a command changed. The walk is
// capture's, lenient: an entry that vanished or cannot be read mid-walk
// is reported as absent rather than failing the whole scan.
func scanTree(root string) (map[string]fileStamp, error) {
	out := make(map[string]fileStamp)
	err := capture.Walk(root, capture.Options{Lenient: true}, func(e *capture.Entry) error {
		st := fileStamp{size: e.Size, mtime: e.Mtime, mode: e.Mode, ino: e.Ino, ctime: e.Ctime}
		if e.Type() == unix.S_IFDIR {
			// A directory's size and times change with its entries,
			// which are reported on their own.
			st.size, st.mtime, st.ctime = 0, 0, 0
		}
		out[e.Rel] = st
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
