package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/secrets"
)

// Errors from Record; test with errors.Is.
var (
	// ErrClosed: Record was called after Close.
	ErrClosed = errors.New("audit logger closed")
	// ErrEventTooLarge: the event's line would exceed MaxLineLen, which
	// Verify would not read back. Nothing was written.
	ErrEventTooLarge = errors.New("audit event too large")
)

// Durability says when appended events are forced to stable storage.
type Durability struct {
	mode     int
	interval time.Duration
}

const (
	modeNone = iota
	modeInterval
	modeEvent
)

// The durability choices. What a crash loses:
//   - NoSync: nothing when only the process dies (the kernel has the
//     bytes); after a power loss or kernel crash, whatever the kernel had
//     not yet written back, typically the last 5 to 30 seconds.
//   - SyncEvery(d): after a power loss, at most the events of the last d
//     (plus one fsync's duration). The default is SyncEvery(100ms).
//   - SyncEachEvent: nothing that Record reported as written; each Record
//     waits for an fsync, so it is the slowest.
var (
	NoSync        = Durability{mode: modeNone}
	SyncEachEvent = Durability{mode: modeEvent}
)

// SyncEvery returns the durability that fsyncs at most every d while
// events are being written. d <= 0 means SyncEachEvent.
func SyncEvery(d time.Duration) Durability {
	if d <= 0 {
		return SyncEachEvent
	}
	return Durability{mode: modeInterval, interval: d}
}

func (d Durability) String() string {
	switch d.mode {
	case modeNone:
		return "none"
	case modeEvent:
		return "each-event"
	}
	return "every-" + d.interval.String()
}

// Option configures a Logger.
type Option func(*options) error

type options struct {
	scrubber   *secrets.Scrubber
	sessionID  string
	durability Durability
	maxSize    int64
	log        *slog.Logger
	key        *Key
}

// WithScrubber redacts every string field of every event with s before it
// is written.
func WithScrubber(s *secrets.Scrubber) Option {
	return func(o *options) error { o.scrubber = s; return nil }
}

// WithSessionID sets session_id on events recorded without one.
func WithSessionID(id string) Option {
	return func(o *options) error { o.sessionID = id; return nil }
}

// WithDurability chooses when events are fsynced; see Durability.
func WithDurability(d Durability) Option {
	return func(o *options) error { o.durability = d; return nil }
}

// WithMaxSize rotates the log when appending would make it larger than n
// bytes: the file is renamed to PATH.<last seq, 20 digits> and a new one is
// started whose chain continues the old one. 0 (the default) never rotates.
func WithMaxSize(n int64) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("audit: negative max size %d", n)
		}
		o.maxSize = n
		return nil
	}
}

// WithKey makes the chain keyed: each event carries key_id and its hash is
// HMAC-SHA256 under k instead of SHA-256, and so is the head record, so
// that rewriting or cutting the log needs the key. A nil k leaves the
// chain unkeyed. Events already in the log keep the chain they were
// written with.
func WithKey(k *Key) Option {
	return func(o *options) error { o.key = k; return nil }
}

// WithLogger sets where the logger reports repairs and sync failures.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l != nil {
			o.log = l
		}
		return nil
	}
}

// Logger appends events to a hash-chained JSONL file. It is safe for
// concurrent use, and any number of Loggers, in this process or others, may
// append to one path: each append holds an advisory lock (flock on
// PATH.lock) and continues the chain from the last line on disk.
type Logger struct {
	path string
	o    options

	mu     sync.Mutex
	lockf  *os.File
	headf  *os.File // PATH.head, rewritten after each append
	f      *os.File
	fid    fileID
	closed bool
	dirty  bool
	// What the file ended with after our last append, so that the next
	// append can skip re-reading it when nobody else has written.
	cacheOK   bool
	cacheSize int64
	lastSeq   uint64
	lastHash  string
	// mismatch, when set, says how the log on disk disagreed with its
	// head record; the next append records it first (ActionHeadMismatch).
	mismatch string

	stop chan struct{}
	done chan struct{}
}

type fileID struct{ dev, ino uint64 }

// Open opens (creating with mode 0600 if needed) the log at path for
// appending. The directory must exist. It fails with an error wrapping
// ErrMalformed when the file's last line is not an audit event.
func Open(path string, opts ...Option) (*Logger, error) {
	o := options{durability: SyncEvery(100 * time.Millisecond)}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	// O_NOFOLLOW: the log often lives inside a workspace that commands
	// can write to; a planted symlink must not redirect it.
	lockf, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open lock file: %w", err)
	}
	headf, err := os.OpenFile(path+HeadSuffix, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		lockf.Close()
		return nil, fmt.Errorf("audit: open head record: %w", err)
	}
	l := &Logger{path: path, o: o, lockf: lockf, headf: headf}
	if err := l.reopen(); err != nil {
		lockf.Close()
		headf.Close()
		return nil, err
	}
	// Read the chain head now, so that a file that is not a log (or a
	// rotated file that is not) is reported by Open rather than by the
	// first Record, and a torn tail is repaired before anyone relies on it.
	if err := flock.Lock(context.Background(), lockf); err != nil {
		l.f.Close()
		lockf.Close()
		headf.Close()
		return nil, fmt.Errorf("audit: lock: %w", err)
	}
	_, err = l.current()
	flock.Unlock(lockf)
	if err != nil {
		l.f.Close()
		lockf.Close()
		headf.Close()
		return nil, err
	}
	if o.durability.mode == modeInterval {
		l.stop, l.done = make(chan struct{}), make(chan struct{})
		go l.syncLoop(o.durability.interval)
	}
	return l, nil
}

// Path is the live log file.
func (l *Logger) Path() string { return l.path }

func (l *Logger) reopen() error {
	_, statErr := os.Lstat(l.path)
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("audit: open log: %w", err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		// A new file is only durable once its directory entry is.
		syncDir(filepath.Dir(l.path))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: stat log: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		// An audit log may quote commands and paths; keep it private.
		if err := f.Chmod(0o600); err != nil {
			l.o.log.Warn("audit log is readable by others and could not be restricted", "path", l.path, "err", err)
		}
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f = f
	l.fid = idOf(st)
	l.cacheOK = false
	return nil
}

func idOf(st os.FileInfo) fileID {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return fileID{dev: uint64(s.Dev), ino: uint64(s.Ino)}
	}
	return fileID{}
}

func (l *Logger) syncLoop(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.mu.Lock()
			if l.dirty && !l.closed {
				if err := l.f.Sync(); err != nil {
					l.o.log.Error("audit log fsync failed", "path", l.path, "err", err)
				}
				l.dirty = false
			}
			l.mu.Unlock()
		}
	}
}

// Record appends e to the log. It fills in Time (when zero), Seq, PrevHash
// and Hash, sets SessionID when the logger has one and e has none, and
// redacts every string field with the logger's scrubber. It returns once
// the line is written (and, with SyncEachEvent, synced). When ctx ends
// while another process holds the log's lock, Record returns ctx's error
// and writes nothing.
func (l *Logger) Record(ctx context.Context, e Event) error {
	return l.appendEvents(ctx, []Event{e})
}

// RecordBatch appends events in order as Record would one by one, but
// under one hold of the lock, with one read of the chain head, one write
// of all the lines and (with SyncEachEvent) one fsync: the chain runs from
// event to event inside the batch, and no other writer's line can fall
// between two of them. The caller's slice is not modified.
//
// The batch is all or nothing: an event too large (ErrEventTooLarge), a
// lock that ctx gives up on, or a failed write leaves the log as it was.
// A batch goes whole into one file: when it would carry a non-empty file
// past WithMaxSize, the file is rotated first, so a batch larger than the
// limit makes a file larger than the limit. The lines are built in memory
// before the write, so split batches of unbounded size.
//
// A crash (or power loss before the fsync) in the middle of the write can
// leave a prefix of the batch: whole lines, each valid and chained, and
// perhaps a torn last line. Verify reports the torn line as ErrTornTail and
// accepts the whole lines before it; the next append cuts the torn line
// off. A process that died mid-batch therefore leaves the first events of
// the batch and never a gap or a forged line.
func (l *Logger) RecordBatch(ctx context.Context, events []Event) error {
	return l.appendEvents(ctx, events)
}

func (l *Logger) appendEvents(ctx context.Context, events []Event) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if len(events) == 0 {
		return nil
	}
	if err := flock.Lock(ctx, l.lockf); err != nil {
		return fmt.Errorf("audit: lock: %w", err)
	}
	defer flock.Unlock(l.lockf)

	size, err := l.current()
	if err != nil {
		return err
	}
	seq, prev := l.lastSeq, l.lastHash
	first := seq
	if l.mismatch != "" {
		// Say so in the chain itself before going on from what is left:
		// the appends that follow must not hide the cut.
		events = append([]Event{{Action: ActionHeadMismatch, Decision: "deny", Target: filepath.Base(l.path),
			Reason: "head_mismatch", Detail: l.mismatch}}, events...)
	}

	var buf []byte
	for i, e := range events {
		if e.Time.IsZero() {
			e.Time = time.Now()
		}
		e.Time = e.Time.UTC()
		if e.SessionID == "" {
			e.SessionID = l.o.sessionID
		}
		e.scrub(l.o.scrubber)
		e.Seq = seq + 1
		e.PrevHash = prev
		e.KeyID = ""
		if l.o.key != nil {
			e.KeyID = l.o.key.id
		}
		canon, err := e.canonical()
		if err != nil {
			return fmt.Errorf("audit: encode event %d of %d: %w", i+1, len(events), err)
		}
		if len(canon)+len(hashKey)+hashLen+3 > MaxLineLen {
			return fmt.Errorf("audit: %w: event %d of %d: %d bytes, at most %d", ErrEventTooLarge, i+1, len(events), len(canon), MaxLineLen)
		}
		if buf == nil {
			// Guess the batch's size from its first line, within reason.
			buf = make([]byte, 0, min((len(canon)+len(hashKey)+hashLen+3+32)*len(events), 4<<20))
		}
		sum := l.o.key.hashOf(prev, canon)
		buf = append(buf, canon[:len(canon)-1]...)
		buf = append(buf, hashKey...)
		buf = append(buf, sum...)
		buf = append(buf, '"', '}', '\n')
		seq, prev = e.Seq, sum
	}

	if l.o.maxSize > 0 && size > 0 && size+int64(len(buf)) > l.o.maxSize {
		if err := l.rotate(first); err != nil {
			return err
		}
		size = 0
	}
	if n, err := l.f.Write(buf); err != nil {
		// Take a partial batch back out so that the next append does not
		// glue onto it; if that fails too, the next append repairs a torn
		// line but keeps the whole ones (see RecordBatch).
		if n > 0 {
			_ = l.f.Truncate(size)
		}
		l.cacheOK = false
		return fmt.Errorf("audit: append: %w", err)
	}
	switch l.o.durability.mode {
	case modeEvent:
		if err := l.f.Sync(); err != nil {
			l.cacheOK = false
			return fmt.Errorf("audit: fsync: %w", err)
		}
	case modeInterval:
		l.dirty = true
	}
	l.cacheOK, l.cacheSize, l.lastSeq, l.lastHash = true, size+int64(len(buf)), seq, prev
	l.mismatch = ""
	// The head goes after the lines: a crash between the two leaves it
	// behind the log, which Verify accepts, never ahead of it.
	if _, err := l.headf.WriteAt(encodeHead(l.o.key, seq, prev), 0); err != nil {
		l.o.log.Error("audit head record not updated; a cut of the newest events would go unseen", "path", l.path, "err", err)
	}
	return nil
}

// hashOf is the chain hash of a line: SHA-256 without a key, HMAC-SHA256
// with one.
func (k *Key) hashOf(prev string, canonical []byte) string {
	if k == nil {
		return chainHash(prev, canonical)
	}
	return k.mac(prev, canonical)
}

// chainHash is hex(SHA-256(prev_hash as its 64 hex characters || canonical)).
func chainHash(prev string, canonical []byte) string {
	h := sha256.New()
	io.WriteString(h, prev)
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil))
}

// current makes l.f the file now at l.path (another process may have
// rotated it) and loads the chain head from disk unless nothing changed
// since our own last append. It returns the file size. Call with the lock.
func (l *Logger) current() (int64, error) {
	st, err := os.Stat(l.path)
	if err != nil || idOf(st) != l.fid {
		if err := l.reopen(); err != nil {
			return 0, err
		}
	}
	fst, err := l.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("audit: stat log: %w", err)
	}
	size := fst.Size()
	if l.cacheOK && size == l.cacheSize {
		return size, nil
	}
	size, seq, hash, keyID, err := l.readHead(size)
	if err != nil {
		return 0, err
	}
	if keyID != "" && (l.o.key == nil || l.o.key.id != keyID) {
		// Appending unkeyed (or under another key) to a keyed chain would
		// break it for good; the writer is misconfigured, not the log.
		have := "none"
		if l.o.key != nil {
			have = l.o.key.id
		}
		return 0, fmt.Errorf("audit: %s: %w: it is keyed with key %s, this writer has %s", l.path, ErrKeyRequired, keyID, have)
	}
	if err := l.checkHead(seq, hash, keyID != ""); err != nil {
		return 0, err
	}
	l.cacheOK, l.cacheSize, l.lastSeq, l.lastHash = true, size, seq, hash
	return size, nil
}

// checkHead compares the chain head found in the log with the head
// record, and notes a disagreement for the next append to record. Call
// with the lock.
func (l *Logger) checkHead(seq uint64, hash string, lastKeyed bool) error {
	l.mismatch = ""
	b := make([]byte, headSize+1)
	n, err := l.headf.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("audit: read head record: %w", err)
	}
	if n == 0 {
		// No head yet: a new log, or one written before head records.
		// An unkeyed log gets one from its next append. A keyed chain
		// always had one, so its loss is reported.
		if seq > 0 && lastKeyed {
			l.mismatch = fmt.Sprintf("the head record is missing; the log ends at seq %d", seq)
		}
		return nil
	}
	h, err := decodeHead(b[:n], l.o.key)
	switch {
	case errors.Is(err, ErrKeyRequired):
		return fmt.Errorf("audit: %s: %w", l.path, err)
	case err != nil:
		l.mismatch = fmt.Sprintf("the head record is damaged (%v); the log ends at seq %d", err, seq)
	case h.Seq > seq && seq == 0:
		l.mismatch = fmt.Sprintf("the log is empty, but its head record says it held seq %d (hash %s): the file was emptied or removed", h.Seq, h.Hash)
	case h.Seq > seq:
		l.mismatch = fmt.Sprintf("the log ends at seq %d, but its head record says seq %d (hash %s): events %d..%d were cut from the end", seq, h.Seq, h.Hash, seq+1, h.Seq)
	case h.Seq == seq && h.Hash != hash:
		l.mismatch = fmt.Sprintf("seq %d has hash %s, but the head record says %s: the end of the log was rewritten", seq, hash, h.Hash)
	}
	// Behind the log is fine: a writer died between the two writes, or
	// one that keeps no head appended.
	return nil
}

// readHead finds the chain head: the last complete line of the live file,
// or of the newest rotated file when the live one is empty. A torn last
// line (a writer died mid-append) is cut off, since no live writer can be
// writing while we hold the lock.
func (l *Logger) readHead(size int64) (int64, uint64, string, string, error) {
	if size > 0 {
		last, keep, err := lastLine(l.f, size)
		if err != nil {
			return 0, 0, "", "", fmt.Errorf("audit: read log tail: %w", err)
		}
		if keep != size {
			l.o.log.Warn("audit log ended in a torn line; cutting it off", "path", l.path, "bytes", size-keep)
			if err := l.f.Truncate(keep); err != nil {
				return 0, 0, "", "", fmt.Errorf("audit: repair torn tail: %w", err)
			}
			size = keep
		}
		if last != nil {
			seq, hash, keyID, err := headOf(last)
			if err != nil {
				return 0, 0, "", "", fmt.Errorf("audit: %s: last line: %w", l.path, err)
			}
			return size, seq, hash, keyID, nil
		}
	}
	rotated, err := rotatedFiles(l.path)
	if err != nil {
		return 0, 0, "", "", err
	}
	for i := len(rotated) - 1; i >= 0; i-- {
		seq, hash, keyID, ok, err := lastOfFile(rotated[i])
		if err != nil {
			return 0, 0, "", "", err
		}
		if ok {
			return size, seq, hash, keyID, nil
		}
	}
	return size, 0, GenesisHash, "", nil
}

func headOf(line []byte) (uint64, string, string, error) {
	e, err := ParseLine(line)
	if err != nil {
		return 0, "", "", err
	}
	if _, h, ok := splitLine(line); !ok || h != e.Hash {
		return 0, "", "", fmt.Errorf("%w: line does not end with its hash", ErrMalformed)
	}
	return e.Seq, e.Hash, e.KeyID, nil
}

func lastOfFile(path string) (uint64, string, string, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", "", false, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, "", "", false, fmt.Errorf("audit: %w", err)
	}
	last, _, err := lastLine(f, st.Size())
	if err != nil || last == nil {
		return 0, "", "", false, err
	}
	seq, hash, keyID, err := headOf(last)
	if err != nil {
		return 0, "", "", false, fmt.Errorf("audit: %s: last line: %w", path, err)
	}
	return seq, hash, keyID, true, nil
}

// lastLine returns the last newline-terminated line of f (without the
// newline), or nil, and the offset just after it: bytes from there to size
// are a torn line.
func lastLine(f *os.File, size int64) ([]byte, int64, error) {
	// Lines are usually a few hundred bytes: start small, then widen.
	chunk := int64(4 << 10)
	var tail []byte
	end := size
	keep := int64(-1)
	for end > 0 {
		start := end - chunk
		if start < 0 {
			start = 0
		}
		buf := make([]byte, end-start)
		if _, err := f.ReadAt(buf, start); err != nil {
			return nil, 0, err
		}
		tail = append(buf, tail...)
		base := start
		if keep < 0 {
			if i := bytes.LastIndexByte(tail, '\n'); i >= 0 {
				keep = base + int64(i) + 1
			}
		}
		if keep >= 0 {
			// Need the newline before the last line too (or the start).
			rel := int(keep - base - 1) // index of the final newline in tail
			if j := bytes.LastIndexByte(tail[:rel], '\n'); j >= 0 {
				return append([]byte(nil), tail[j+1:rel]...), keep, nil
			}
			if base == 0 {
				return append([]byte(nil), tail[:rel]...), keep, nil
			}
		}
		end = start
		if chunk < 1<<20 {
			chunk *= 2
		}
		if size-end > 64<<20 {
			return nil, 0, fmt.Errorf("%w: last line longer than 64 MiB", ErrMalformed)
		}
	}
	return nil, 0, nil
}

// rotate renames the live file aside and starts a new one. Call with the
// lock held; seq is the last sequence number in the live file.
func (l *Logger) rotate(seq uint64) error {
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("audit: fsync before rotation: %w", err)
	}
	name := rotatedName(l.path, seq)
	// Never rename over history: a file already there means the chain or
	// the directory is not what this logger thinks it is.
	if _, err := os.Lstat(name); err == nil {
		return fmt.Errorf("audit: rotate: %s already exists", name)
	}
	if err := os.Rename(l.path, name); err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	// reopen creates the new file and syncs the directory, which makes
	// the rename durable too.
	if err := l.reopen(); err != nil {
		return err
	}
	l.o.log.Info("audit log rotated", "path", l.path, "to", name)
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func rotatedName(path string, seq uint64) string {
	return fmt.Sprintf("%s.%020d", path, seq)
}

// Files lists the files of the log at path, oldest first: the files
// rotated from it (PATH.<last seq, 20 digits>), then path itself if it
// exists.
func Files(path string) ([]string, error) {
	files, err := rotatedFiles(path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err == nil {
		files = append(files, path)
	}
	return files, nil
}

// rotatedFiles lists PATH.<20 digits> files, oldest first.
func rotatedFiles(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: list rotated files: %w", err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, base+".") {
			continue
		}
		suf := n[len(base)+1:]
		if len(suf) != 20 {
			continue
		}
		if _, err := strconv.ParseUint(suf, 10, 64); err != nil {
			continue
		}
		out = append(out, filepath.Join(dir, n))
	}
	sort.Strings(out)
	return out, nil
}

// Sync forces what was recorded so far to stable storage, whatever the
// durability option.
func (l *Logger) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("audit: fsync: %w", err)
	}
	l.dirty = false
	return nil
}

// Close syncs (unless NoSync) and closes the log. It is idempotent.
func (l *Logger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	stop, done := l.stop, l.done
	var err error
	if l.o.durability.mode != modeNone {
		err = l.f.Sync()
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if cerr := l.lockf.Close(); err == nil {
		err = cerr
	}
	if cerr := l.headf.Close(); err == nil {
		err = cerr
	}
	l.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	return err
}
