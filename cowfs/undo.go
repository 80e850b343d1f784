package cowfs

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Undo reverts the most recently committed transaction still in the undo
// journal, with the same protocol and conflict check as Commit: every
// path must still be exactly as that commit left it. It returns what was
// undone; ErrNotFound when the journal is empty.
func (f *FS) Undo(ctx context.Context) (*TxInfo, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	entries, err := f.doneEntries()
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: nothing to undo", ErrNotFound)
	}
	name := entries[len(entries)-1]
	info, w, afters, err := f.readDone(name)
	if err != nil {
		return nil, err
	}
	recs, blobs, err := undoRecs(name, w, afters)
	if err != nil {
		return nil, err
	}
	t := &Tx{fs: f, id: newID(), desc: "undo " + info.ID + ": " + w.Desc, created: time.Now().UTC(),
		undoes: name, changes: map[string]*change{}}
	if err := f.createTx(t, recs, blobs); err != nil {
		return nil, err
	}
	_, err = t.commitLocked(ctx)
	f.account(t.id, 0, false)
	if err != nil {
		if st, _ := f.txState(t.id); st == StateOpen {
			f.removeState(t.dir())
		}
		return nil, err
	}
	return &info, nil
}

// readDone reads the undo journal's entry name: what was committed, its
// WAL and the after-images the commit left.
func (f *FS) readDone(name string) (TxInfo, *walFile, []snapshot, error) {
	info, err := f.doneInfo(name)
	if err != nil {
		return TxInfo{}, nil, nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	wb, err := f.state.ReadFile("done/" + name + "/wal")
	if err != nil {
		return TxInfo{}, nil, nil, err
	}
	w, err := decodeWAL(wb)
	if err != nil {
		return TxInfo{}, nil, nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	ab, err := f.state.ReadFile("done/" + name + "/after")
	if err != nil {
		return TxInfo{}, nil, nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	afters, err := decodeAfter(ab, len(w.Ops))
	if err != nil {
		return TxInfo{}, nil, nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	return info, w, afters, nil
}

// undoRecs stages the inverse of the commit w of undo entry name: each
// path back to its before-image, expected to be as the commit left it
// (afters). blobs maps the saved previous bytes to their files.
func undoRecs(name string, w *walFile, afters []snapshot) ([]stageRec, map[string]string, error) {
	var recs []stageRec
	blobs := map[string]string{}
	for i := range w.Ops {
		op, a := &w.Ops[i], afters[i]
		b := op.Before
		var c *change
		switch b.Type {
		case typeAbsent:
			if a.Type != typeAbsent {
				c = &change{Path: op.Path, Kind: KindDelete}
			}
		case typeFile:
			if !op.Prev {
				return nil, nil, fmt.Errorf("%w: undo entry %s: previous bytes of %q were not saved", ErrRecovery, name, op.Path)
			}
			c = &change{Path: op.Path, Kind: KindWrite, Mode: b.Mode, Blob: b.SHA, Size: b.Size}
			blobs[b.SHA] = "done/" + name + "/prev/" + strconv.Itoa(i)
		case typeSymlink:
			c = &change{Path: op.Path, Kind: KindSymlink, Target: b.Target}
		case typeDir:
			if op.Implicit {
				continue // it existed before; the commit did not touch it
			}
			c = &change{Path: op.Path, Kind: KindMkdir, Mode: b.Mode}
		}
		if c == nil {
			continue
		}
		c.Before = a
		recs = append(recs, stageRec{Op: "set", Change: c})
	}
	return recs, blobs, nil
}
