package cowfs

import (
	"context"
	"errors"
	"os"

	"github.com/pulse-agent/pulse/internal/flock"
)

// A lane's record is needed while the lane can still matter: while it has
// transactions of its own pending (their stack is the record's), while a
// lane forked from it exists (its stack goes through the record), and
// while an FS is open on it (that FS's commands see the stack the record
// defines). An FS open on a lane holds a shared flock on the lane's
// record, taken under the workspace lock when it opens (and the FS that
// forked a lane holds one on the new record until it closes, so that the
// lane does not go before the FS meant for it opens); whoever removes
// a record holds the workspace lock and the record's flock exclusively,
// so no FS opens on a lane while its record goes, and none that is open
// loses it.
//
// Records nothing needs are removed when an FS closes (and by Lanes),
// lanes with no pending transaction, child or open FS first, then their
// parents that this leaves unused. Nothing is removed while any pending
// transaction or lane record cannot be read: its lane or parent is then
// unknown, and may be the one about to go. A removal is one unlink of a
// file that is never changed, then an fsync of lanes/: a crash leaves the
// record whole or gone, and gone only once unused.

// holdLaneLocked takes a shared flock on lane id's record, held until
// the FS closes; the caller holds the workspace lock and knows that the
// lane exists. An FS holds its own lane's and those of the lanes it
// forked, so that a new lane is not removed before the FS meant for it
// opens.
func (f *FS) holdLaneLocked(id string) error {
	if id == DefaultLane {
		return nil
	}
	h, err := f.state.Open("lanes/" + id)
	if err != nil {
		return err
	}
	// Nobody else holds it exclusively: a remover holds the workspace
	// lock, which this caller has.
	if err := flock.TryLockShared(h); err != nil {
		h.Close()
		return err
	}
	f.mu.Lock()
	f.laneHolds = append(f.laneHolds, h)
	f.mu.Unlock()
	return nil
}

// releaseLane drops the FS's hold on its lane record and removes the
// records nothing needs any more, if the workspace lock is free now (a
// Close does not wait for another process's commit; a later Close or
// Lanes removes them).
func (f *FS) releaseLane() {
	f.mu.Lock()
	holds := f.laneHolds
	f.laneHolds = nil
	f.mu.Unlock()
	for _, h := range holds {
		h.Close()
	}
	if f.state == nil || f.isClosed() {
		return
	}
	if _, err := f.state.Lstat("lanes"); err != nil {
		return // never forked
	}
	now, cancel := context.WithCancel(context.Background())
	cancel() // take the lock only if it is free
	unlock, err := f.lock(now)
	if err != nil {
		return
	}
	defer unlock()
	if err := f.pruneLanesLocked(); err != nil {
		f.log.Warn("cowfs: removing unused lane records", "err", err)
	}
}

// pruneLanesLocked removes every lane record nothing needs; the caller
// holds the workspace lock.
func (f *FS) pruneLanesLocked() error {
	ls, err := f.readLanesLocked()
	if err != nil || len(ls.recs) == 0 || len(ls.bad) > 0 {
		return err
	}
	ids, err := f.txIDs()
	if err != nil {
		return err
	}
	// Every transaction's lane, or none of the records goes.
	st, err := f.stackAll()
	if err != nil || st == nil {
		return err
	}
	read := map[string]bool{}
	used := map[string]bool{}
	for _, t := range st.all {
		read[t.ID] = true
		used[t.Lane] = true
	}
	for _, id := range ids {
		if !read[id] {
			return nil // being committed or damaged: its lane is unknown
		}
	}
	removed := false
	for {
		for _, r := range ls.recs {
			used[r.Parent] = true
		}
		gone := 0
		for id := range ls.recs {
			if used[id] {
				continue
			}
			ok, err := f.removeLaneLocked(id)
			if err != nil {
				return err
			}
			if ok {
				delete(ls.recs, id)
				delete(f.laneCache, id)
				gone++
				removed = true
			} else {
				used[id] = true // open: kept, and so its parents
			}
		}
		if gone == 0 {
			break
		}
		used = map[string]bool{}
		for _, t := range st.all {
			used[t.Lane] = true
		}
	}
	if removed {
		return f.syncState("lanes")
	}
	return nil
}

// removeLaneLocked removes lane id's record unless an FS holds it open.
func (f *FS) removeLaneLocked(id string) (bool, error) {
	h, err := f.state.Open("lanes/" + id)
	if err != nil {
		return false, err
	}
	defer h.Close()
	if err := flock.TryLock(h); err != nil {
		if errors.Is(err, flock.ErrLocked) {
			return false, nil
		}
		return false, err
	}
	if err := f.state.Remove("lanes/" + id); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return true, nil
}

// stackAll reads every lane's pending transactions (Stack.all), or nil
// when some could not be read (damaged).
func (f *FS) stackAll() (*Stack, error) {
	st, err := f.stackLocked()
	if err != nil {
		if errors.Is(err, ErrLane) {
			return nil, nil // this FS's own lane is unusable: leave the records be
		}
		return nil, err
	}
	if len(st.Damaged) > 0 {
		return nil, nil
	}
	return st, nil
}
