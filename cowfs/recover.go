package cowfs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// recover runs at Open, under the lock: it empties the trash, drops
// half-built transactions and aborted commit attempts, rolls forward every
// commit whose WAL is in place, and quarantines the ones it cannot.
func (f *FS) recover(ctx context.Context) error {
	unlock, err := f.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if names, err := f.readDirNames("trash"); err == nil {
		for _, n := range names {
			f.state.RemoveAll("trash/" + n)
		}
	}
	if d, err := f.state.Open("tx"); err == nil {
		names, _ := d.Readdirnames(-1)
		d.Close()
		for _, n := range names {
			if len(n) > 5 && n[:5] == ".new-" {
				f.state.RemoveAll("tx/" + n)
			}
		}
	}
	ids, err := f.txIDs()
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		dir := "tx/" + id
		if st, reason, has := f.txStateNames(id); st == StateQuarantined {
			errs = append(errs, fmt.Errorf("%w: transaction %s is quarantined: %s", ErrRecovery, id, reason))
			continue
		} else if st == StateOpen {
			// A commit that died before its WAL was in place never began.
			if has.may("wal.tmp") {
				f.state.Remove(dir + "/wal.tmp")
			}
			if has.may("prev") {
				f.state.RemoveAll(dir + "/prev")
			}
			if has.may(undoMarker) {
				f.dropStrayUndo(id)
			}
			continue
		}
		if err := f.rollForward(dir, id); err != nil {
			if st, _, has := f.txStateNames(id); st == StateOpen && has.may(undoMarker) && f.dropStrayUndo(id) {
				err = fmt.Errorf("%w (it was an undo: dropped, the commit it reverts stays in the undo journal)", err)
			}
			errs = append(errs, err)
		}
	}
	if err := f.prune(); err != nil {
		errs = append(errs, err)
	}
	// The staged-bytes total is not counted here but when a limit check
	// first needs it (countStaged): most Opens never stage.
	f.mu.Lock()
	f.recoveryErr = errors.Join(errs...)
	f.mu.Unlock()
	return nil
}

func (f *FS) rollForward(dir, id string) error {
	b, err := f.state.ReadFile(dir + "/wal")
	if err != nil {
		return f.quarantine(id, fmt.Sprintf("unreadable WAL: %v", err))
	}
	w, err := decodeWAL(b)
	if err != nil {
		return f.quarantine(id, err.Error())
	}
	if w.ID != id {
		return f.quarantine(id, fmt.Sprintf("WAL names transaction %s", w.ID))
	}
	if err := f.checkLinks(w, true); err != nil {
		return f.quarantine(id, err.Error())
	}
	blobs := f.blobReader(dir)
	defer blobs.close()
	for i := range w.Ops {
		op := &w.Ops[i]
		if op.Kind != KindWrite {
			continue
		}
		if cur, err := f.ws.snap(op.Path, nil); err == nil && matchesAfter(op, cur) {
			continue // already written; its blob is not needed
		}
		if err := blobs.check(&op.change); err != nil {
			f.newApplier(dir, w, true).dropTemps()
			return f.quarantine(id, err.Error())
		}
	}
	a := f.newApplier(dir, w, true)
	err = f.precheck(w)
	if ce := (*ConflictError)(nil); errors.As(err, &ce) {
		return f.recoverConflict(a, id, ce)
	}
	var afters []snapshot
	if err == nil {
		afters, err = a.apply()
	}
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			a.dropTemps()
			return f.quarantine(id, ce.Error())
		}
	}
	if err == nil {
		// Before cleanup, as a commit does (writeAfter).
		err = f.writeAfter(dir, afters)
	}
	if err != nil {
		// It cannot be finished (a full disk, say): take it back, so the
		// workspace is whole and the transaction pending again.
		if rerr := f.abandon(a, err); rerr != nil {
			return fmt.Errorf("%w: transaction %s: roll forward: %w", ErrRecovery, id, errors.Join(err, rerr))
		}
		return fmt.Errorf("%w: transaction %s could not be rolled forward; it was rolled back and is pending: %w", ErrRecovery, id, err)
	}
	if err := a.cleanup(); err != nil {
		return fmt.Errorf("%w: transaction %s: roll forward: %w", ErrRecovery, id, err)
	}
	if err := f.finish(dir, w, afters); err != nil {
		return fmt.Errorf("%w: transaction %s: roll forward: %w", ErrRecovery, id, err)
	}
	f.log.Info("cowfs: rolled an interrupted commit forward", "tx", id, "changes", len(w.Ops))
	return nil
}

// recoverConflict decides what becomes of an interrupted commit whose
// workspace the precheck found changed (ce), before recovery wrote
// anything. Where a directory on the way is not a real directory now
// (swapped for a symlink, say), what the commit did beneath it cannot be
// seen, so it can neither be finished nor taken back, nor be known to
// have done nothing there; the swap may be undone, so the WAL stays, as
// it was, for the next Open (Discard rolls it back). Where the workspace
// holds nothing of the commit (it died before writing), the transaction
// is pending again, its WAL dropped: there is nothing to roll back, and
// the commit can be made again once the workspace is put right. Only a
// commit that had written part of itself is quarantined.
func (f *FS) recoverConflict(a *applier, id string, ce *ConflictError) error {
	if err := a.hidden(); err != nil {
		if he := (*ConflictError)(nil); !errors.As(err, &he) || *he != *ce {
			err = errors.Join(ce, err)
		}
		f.log.Warn("cowfs: an interrupted commit is left for the next Open: a directory on its way is not a real directory", "tx", id, "err", err)
		return fmt.Errorf("%w: transaction %s is left committing, for the next Open to roll forward once the workspace is put back (Discard rolls it back): %w", ErrRecovery, id, err)
	}
	if a.untouched() {
		if err := f.reopen(a, ce); err != nil {
			return fmt.Errorf("%w: transaction %s: %w", ErrRecovery, id, errors.Join(ce, err))
		}
		return fmt.Errorf("%w: transaction %s was interrupted before it wrote anything and is pending again: %w", ErrRecovery, id, ce)
	}
	a.dropTemps()
	return f.quarantine(id, ce.Error())
}

func (f *FS) quarantine(id, reason string) error {
	f.log.Error("cowfs: quarantined an interrupted commit", "tx", id, "reason", reason)
	if err := f.replaceFileSync("tx/"+id+"/quarantine", []byte(reason+"\n")); err != nil {
		f.log.Error("cowfs: cannot write quarantine marker", "tx", id, "err", err)
	}
	return fmt.Errorf("%w: transaction %s quarantined: %s", ErrRecovery, id, reason)
}

// undoMarker is the file Undo's transaction is made with (createTx),
// holding the journal entry it reverts: recovery looks for the name in
// the listing of each open transaction it makes anyway, and reads a
// stage log's begin record only where the name is.
const undoMarker = "undo"

// dropStrayUndo removes the open transaction id if Undo made it (its
// begin record names the journal entry it reverts), and reports whether
// it did. Recovery calls it for a transaction whose directory holds
// undoMarker; the begin record, not the marker, decides. Undo holds the lock from making its transaction to removing it
// when the commit does not happen, so under the lock an open one is an
// undo that was killed before its commit point, or whose interrupted
// commit recovery rolled back. Left open, it would be a pending
// transaction nobody staged, reverting a commit that is still in the
// journal: every command would run on it, the next commit --all would
// apply it with whatever was staged on top, and once Undo was run again
// its before snapshots would no longer hold, so it would make every
// commit --all refuse. Dropping it leaves things as they were before
// the undo began; Undo can be run again.
func (f *FS) dropStrayUndo(id string) bool {
	undoes := f.beginUndoes(id)
	if undoes == "" {
		return false
	}
	if err := f.removeState("tx/" + id); err != nil {
		f.log.Error("cowfs: cannot drop an undo that did not commit", "tx", id, "undoes", undoes, "err", err)
		return false
	}
	f.log.Warn("cowfs: dropped an undo that did not commit; the commit it reverts stays in the undo journal", "tx", id, "undoes", undoes)
	return true
}

// beginUndoes reads only the begin record of transaction id's stage log
// and returns the undo entry it reverts; "" when it reverts none or the
// record cannot be read (a damaged transaction is left as it is).
func (f *FS) beginUndoes(id string) string {
	fl, err := f.state.Open("tx/" + id + "/stage.log")
	if err != nil {
		return ""
	}
	defer fl.Close()
	var h [frameHeader]byte
	if _, err := io.ReadFull(fl, h[:]); err != nil {
		return ""
	}
	n := binary.LittleEndian.Uint32(h[:4])
	if n == 0 || n > maxRecord {
		return ""
	}
	buf := make([]byte, frameHeader+int(n))
	copy(buf, h[:])
	if _, err := io.ReadFull(fl, buf[frameHeader:]); err != nil {
		return ""
	}
	frames, _, err := decodeFrames(buf)
	if err != nil || len(frames) != 1 {
		return ""
	}
	r, err := decodeStageRec(frames[0])
	if err != nil || r.Op != "begin" || r.ID != id {
		return ""
	}
	if _, _, ok := parseDone(r.Undoes); !ok {
		return ""
	}
	return r.Undoes
}
