package cowfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// stageRec is one record of a transaction's stage log.
type stageRec struct {
	Op      string `json:"op"` // begin, batch, set, unstage
	ID      string `json:"id,omitempty"`
	Desc    string `json:"desc,omitempty"`
	Created int64  `json:"created,omitempty"`
	Undoes  string `json:"undoes,omitempty"`
	// Sealed (begin) says the log has a seal (tx/<id>/seal).
	Sealed bool    `json:"sealed,omitempty"`
	Path   string  `json:"path,omitempty"`
	Change *change `json:"change,omitempty"`
	// N is the number of set and unstage records a batch record heads.
	N int `json:"n,omitempty"`
	// Squashes, on a begin record, lists the transactions this one
	// replaces (see stack.go).
	Squashes []string `json:"squashes,omitempty"`
	// Lane, on a begin record, is the lane that made the transaction
	// (lane.go); absent for the default lane.
	Lane string `json:"lane,omitempty"`
}

func decodeStageRec(p []byte) (stageRec, error) {
	var r stageRec
	if err := json.Unmarshal(p, &r); err != nil {
		return r, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	switch r.Op {
	case "begin":
		if r.Lane != DefaultLane && !validID(r.Lane) {
			return r, fmt.Errorf("%w: bad lane %q", errCorrupt, r.Lane)
		}
	case "batch":
		if r.N < 1 {
			return r, fmt.Errorf("%w: batch of %d records", errCorrupt, r.N)
		}
	case "set":
		if r.Change == nil {
			return r, fmt.Errorf("%w: set record without change", errCorrupt)
		}
		if err := checkChange(r.Change); err != nil {
			return r, err
		}
	case "unstage", "whiteout":
		if !isCleanRel(r.Path) {
			return r, fmt.Errorf("%w: bad path %q", errCorrupt, r.Path)
		}
	default:
		return r, fmt.Errorf("%w: unknown op %q", errCorrupt, r.Op)
	}
	return r, nil
}

// load reads the whole stage log without the lock and without repairing
// it (for List).
func (t *Tx) load() error {
	b, err := t.fs.state.ReadFile(t.dir() + "/stage.log")
	if err != nil {
		return err
	}
	recs, good, _, err := replayLog(b, true)
	if err != nil {
		return err
	}
	for _, r := range recs {
		t.apply(r)
	}
	// A log without a whole begin record (emptied, or cut inside its
	// first record) is checked too, which it cannot pass: it is no
	// transaction that is still empty.
	if t.sealed || len(recs) == 0 {
		return t.checkSeal(int64(good))
	}
	return nil
}

// replayLog decodes stage log bytes b, which start at a record boundary
// (atStart: the start of the log, which must be the begin record). It
// returns the records of the whole frames and whole batches, and good,
// the offset just past the last of them. tail is true when b goes on
// past good with a torn frame or a batch missing records: what an append
// that never returned left, which the holder of the lock cuts away. Any
// other damage is an error wrapping errCorrupt.
func replayLog(b []byte, atStart bool) (recs []stageRec, good int, tail bool, err error) {
	frames, _, ferr := decodeFrames(b)
	if ferr != nil {
		if !errors.Is(ferr, io.ErrUnexpectedEOF) {
			return nil, 0, false, ferr
		}
		tail = true
	}
	for i := 0; i < len(frames); {
		r, err := decodeStageRec(frames[i])
		if err != nil {
			return nil, 0, false, err
		}
		if first := atStart && i == 0; first != (r.Op == "begin") {
			return nil, 0, false, fmt.Errorf("%w: stage log does not start with one begin record", errCorrupt)
		}
		if r.Op != "batch" {
			recs = append(recs, r)
			good += frameHeader + len(frames[i])
			i++
			continue
		}
		if r.N > len(frames)-i-1 {
			// The batch's append never finished: none of it counts.
			return recs, good, true, nil
		}
		size := frameHeader + len(frames[i])
		for _, p := range frames[i+1 : i+1+r.N] {
			br, err := decodeStageRec(p)
			if err != nil {
				return nil, 0, false, err
			}
			if br.Op != "set" && br.Op != "unstage" && br.Op != "whiteout" {
				return nil, 0, false, fmt.Errorf("%w: %q record inside a batch", errCorrupt, br.Op)
			}
			recs = append(recs, br)
			size += frameHeader + len(p)
		}
		good += size
		i += 1 + r.N
	}
	return recs, good, tail, nil
}

// refreshLocked brings the in-memory view up to date with the stage log,
// which another process may have appended to, and checks the transaction
// may still be staged into (open=true) or at least read. A torn tail left
// by a writer that crashed mid-append is cut off; the caller holds the
// lock, so no live writer is mid-append.
func (t *Tx) refreshLocked(open bool) error {
	f, err := t.openLog(open)
	if err != nil {
		return err
	}
	defer f.Close()
	recs, good, err := t.readLog(f)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range recs {
		t.apply(r)
	}
	t.offset += int64(good)
	t.loaded = true
	// Records another process appended count toward the total too.
	t.fs.account(t.id, t.bytes, false)
	return nil
}

// openLog opens the stage log for reading and cutting, refused when the
// transaction is gone or, with open, can no longer be staged into.
func (t *Tx) openLog(open bool) (*os.File, error) {
	f, err := t.fs.state.OpenFile(t.dir()+"/stage.log", os.O_RDWR, 0)
	if isNotExist(err) {
		if t.loaded {
			return nil, fmt.Errorf("%w: transaction %s was committed or discarded", ErrClosed, t.id)
		}
		return nil, fmt.Errorf("%w: transaction %s", ErrNotFound, t.id)
	}
	if err != nil {
		return nil, fmt.Errorf("cowfs: transaction %s: %w", t.id, err)
	}
	if open {
		switch st, reason := t.fs.txState(t.id); st {
		case StateQuarantined:
			f.Close()
			return nil, fmt.Errorf("%w: transaction %s is quarantined: %s", ErrRecovery, t.id, reason)
		case StateCommitting:
			f.Close()
			return nil, fmt.Errorf("%w: transaction %s is being committed", ErrClosed, t.id)
		}
	}
	return f, nil
}

// readLog reads the records appended to f since t.offset, and how many
// bytes they take. A sealed log is checked against its seal before a torn
// tail is cut from it.
func (t *Tx) readLog(f *os.File) ([]stageRec, int, error) {
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return nil, 0, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, 0, err
	}
	recs, good, tail, err := replayLog(b, t.offset == 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: transaction %s: stage log: %w", ErrRecovery, t.id, err)
	}
	sealed := t.sealed
	if t.offset == 0 {
		// No whole begin record is damage, not a torn tail to cut (see
		// load): createTx renames the log into place with it.
		sealed = len(recs) == 0 || recs[0].Sealed
	}
	if sealed {
		// Before a torn tail is cut: the cut must never reach records an
		// append that returned wrote.
		if err := t.checkSeal(t.offset + int64(good)); err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrRecovery, err)
		}
	}
	if tail {
		if err := f.Truncate(t.offset + int64(good)); err != nil {
			return nil, 0, err
		}
		t.fs.log.Warn("cowfs: cut a torn stage log tail", "tx", t.id, "at", t.offset+int64(good))
	}
	return recs, good, nil
}

// appendRecs appends to the stage log and fsyncs it, then applies the
// records in memory. The caller holds the lock.
//
// More than one record is headed by a batch record counting them, so
// that readers take all of them or none: a write can be cut short
// (a fatal signal stops a long write at a page boundary) and, before the
// fsync, a power loss may keep any prefix of it. The frames go out in
// two writes, the last record alone, which costs no extra fsync and
// gives the crash tests an instant (fpBatchTorn) where the batch is
// written but for its last record.
func (t *Tx) appendRecs(recs []stageRec) error {
	buf, split, err := encodeRecs(recs)
	if err != nil {
		return err
	}
	end, err := t.writeLog(buf, split, len(recs) > 1)
	if err != nil {
		return err
	}
	t.mu.Lock()
	for _, r := range recs {
		t.apply(r)
	}
	t.offset = end
	t.mu.Unlock()
	return nil
}

// encodeRecs frames recs for the stage log, headed by a batch record
// when there is more than one; split is where the last frame starts.
func encodeRecs(recs []stageRec) (buf []byte, split int, err error) {
	if len(recs) > 1 {
		p, err := json.Marshal(stageRec{Op: "batch", N: len(recs)})
		if err != nil {
			return nil, 0, err
		}
		buf = appendFrame(buf, p)
	}
	for _, r := range recs {
		p, err := json.Marshal(r)
		if err != nil {
			return nil, 0, err
		}
		if len(p) > maxRecord {
			return nil, 0, fmt.Errorf("cowfs: stage: record of %q is %d bytes", r.Path, len(p))
		}
		split = len(buf)
		buf = appendFrame(buf, p)
	}
	return buf, split, nil
}

// writeLog appends the frames buf at t.offset, a batch in two writes
// (split, see appendRecs), fsyncs them and updates the seal. It returns
// the new end of the log; on an error it has taken back what it wrote.
func (t *Tx) writeLog(buf []byte, split int, batch bool) (int64, error) {
	end := t.offset + int64(len(buf))
	f, err := t.fs.state.OpenFile(t.dir()+"/stage.log", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return 0, fmt.Errorf("cowfs: stage: %w", err)
	}
	fail := func(err error) (int64, error) {
		// Take back what was written, so that a call that failed never
		// shows up later; if this fails too, an unfinished batch or torn
		// frame is cut by the next reader, and a whole one is what the
		// caller was told may not have happened.
		f.Truncate(t.offset)
		f.Close()
		return 0, fmt.Errorf("cowfs: stage: %w", err)
	}
	if batch {
		if _, err := f.Write(buf[:split]); err != nil {
			return fail(err)
		}
		failpoint(fpBatchTorn)
		buf = buf[split:]
	}
	if _, err := f.Write(buf); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	failpoint(fpStageLogSynced)
	if t.sealed {
		// The records are durable; a seal that cannot be written only
		// weakens the check of a later cut, so the call still succeeds.
		if err := t.writeSeal(end); err != nil {
			t.fs.log.Warn("cowfs: stage log seal not updated", "tx", t.id, "err", err)
		}
	}
	return end, nil
}

// apply replays one stage record into memory.
func (t *Tx) apply(r stageRec) {
	switch r.Op {
	case "begin":
		t.desc, t.created, t.undoes, t.sealed = r.Desc, time.Unix(0, r.Created).UTC(), r.Undoes, r.Sealed
		t.squashes, t.lane = r.Squashes, r.Lane
	case "whiteout":
		t.applyWhiteout(r.Path)
	case "set":
		delete(t.whiteouts, r.Change.Path)
		if old := t.changes[r.Change.Path]; old != nil {
			t.bytes -= old.Size
		}
		c := *r.Change
		t.changes[c.Path] = &c
		t.bytes += c.Size
	case "unstage":
		if old := t.changes[r.Path]; old != nil {
			t.bytes -= old.Size
			delete(t.changes, r.Path)
		}
	}
}

func checkChange(c *change) error {
	if !isCleanRel(c.Path) {
		return fmt.Errorf("%w: bad path %q", errCorrupt, c.Path)
	}
	switch c.Kind {
	case KindWrite:
		if !validSHA(c.Blob) || c.Size < 0 || c.Off < 0 || c.Off > maxPackBytes || c.Size > maxPackBytes {
			return fmt.Errorf("%w: %q: bad blob", errCorrupt, c.Path)
		}
		if c.Pack != "" && !validPack(c.Pack) {
			return fmt.Errorf("%w: %q: bad pack %q", errCorrupt, c.Path, c.Pack)
		}
	case KindSymlink:
		// The target policy (checkLinkTarget) is applied when a link is
		// staged and again at commit and recovery (checkLinks), which
		// know whether an undo restores a link the workspace held; the
		// record itself only has to be well formed.
		if c.Target == "" || strings.IndexByte(c.Target, 0) >= 0 || len(c.Target) > maxPathLen {
			return fmt.Errorf("%w: %q: bad symlink target", errCorrupt, c.Path)
		}
	case KindMkdir, KindDelete:
	default:
		return fmt.Errorf("%w: %q: unknown kind %q", errCorrupt, c.Path, c.Kind)
	}
	if c.Kind != KindWrite && (c.Pack != "" || c.Off != 0) {
		return fmt.Errorf("%w: %q: pack on a %s", errCorrupt, c.Path, c.Kind)
	}
	if c.Mode&^0o7777 != 0 {
		return fmt.Errorf("%w: %q: bad mode %o", errCorrupt, c.Path, c.Mode)
	}
	switch c.Before.Type {
	case typeAbsent, typeFile, typeDir, typeSymlink:
	default:
		return fmt.Errorf("%w: %q: bad before type %q", errCorrupt, c.Path, c.Before.Type)
	}
	if c.Kind == KindDelete && c.Before.Type == typeAbsent {
		return fmt.Errorf("%w: %q: delete of an absent path", errCorrupt, c.Path)
	}
	return nil
}

func validSHA(s string) bool { return lowerHex(s, 64) }

// isCleanRel reports whether rel is already in the form cleanRel returns.
func isCleanRel(rel string) bool {
	c, err := cleanRel("/", rel)
	return err == nil && c == rel
}
