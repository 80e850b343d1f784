package backend

import (
	"github.com/pulse-agent/pulse/internal/capture"
)

// BaseEntry is one entry ScanBase visits, with what an lstat of it says.
// The same *BaseEntry is reused for every entry: it is valid only during
// the call that receives it.
type BaseEntry = capture.Entry

// ScanBase visits exactly the entries WalkBase visits (the test compares
// the two), with capture.Walk: each directory read with getdents and its
// entries stat'ed relative to the directory's descriptor, without a
// FileInfo, a DirEntry or a path lookup per entry. For a copying
// backend, which walks the whole workspace before every command,
// WalkBase's was most of the host's CPU per command. Every failure to
// read an entry or a directory is an error, as it is for WalkBase's
// callers; unlike WalkBase, a workspace root that is not a directory (a
// symlink) is an error too, not an empty tree.
func (p *Pending) ScanBase(ws string, hidden map[string]bool, fn func(*BaseEntry) error) error {
	return capture.Walk(ws, capture.Options{Filter: func(rel string) capture.Verdict {
		if hidden[rel] {
			return capture.Skip
		}
		// A path the view decides is the caller's (Shown), but for a
		// pending directory over a workspace one: what that holds may
		// show through, so it is walked into.
		if e, decided := p.Lookup(rel); decided {
			if e == nil || e.Kind != PendingDir {
				return capture.Skip
			}
			return capture.Within
		}
		return capture.Visit
	}}, fn)
}
