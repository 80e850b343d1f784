package cowfs

import (
	"context"
	"fmt"
	"time"
)

// Committed is a transaction applied to the workspace and kept for Undo.
type Committed struct {
	ID string
	// At is when its commit finished.
	At time.Time
	// Paths are the paths it changed, in the order it applied them; a
	// removed directory's entries are each listed.
	Paths []string
}

// CommittedSince returns the transactions whose commit finished after t,
// oldest first, from those kept for Undo, and whether that list is
// whole. It is not when commits after t may have been pruned already
// (the store keeps as many as its undo depth allows and the oldest kept
// finished after t), so a caller asking whether a commit changed a path
// since t knows when it cannot be told.
func (f *FS) CommittedSince(ctx context.Context, t time.Time) ([]Committed, bool, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	names, err := f.doneEntries()
	if err != nil {
		return nil, false, err
	}
	// Entries are named by when their commit finished, so they list
	// oldest first, and pruning takes the oldest.
	whole := len(names) < f.opts.undoDepth
	if !whole && len(names) > 0 {
		seq, _, _ := parseDone(names[0])
		whole = !time.Unix(0, int64(seq)).After(t)
	}
	var out []Committed
	for _, name := range names {
		seq, id, _ := parseDone(name)
		at := time.Unix(0, int64(seq))
		if !at.After(t) {
			continue
		}
		b, err := f.state.ReadFile("done/" + name + "/wal")
		if err != nil {
			return nil, false, fmt.Errorf("cowfs: committed transaction %s: %w", id, err)
		}
		w, err := decodeWAL(b)
		if err != nil {
			return nil, false, fmt.Errorf("cowfs: committed transaction %s: %w", id, err)
		}
		c := Committed{ID: id, At: at, Paths: make([]string, len(w.Ops))}
		for j := range w.Ops {
			c.Paths[j] = w.Ops[j].Path
		}
		out = append(out, c)
	}
	return out, whole, nil
}
