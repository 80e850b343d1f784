package audit

import (
	"context"
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/secrets"
)

// Errors from Record; test with errors.Is.
var (
	// ErrClosed: Record was called after Close.
	ErrClosed = errdefs.New("audit logger closed", errdefs.ErrClosed)
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

	// syncMu is held by an fsync of the interval (syncLoop), which runs
	// without mu so that a Record never waits for it, and by whatever
	// must not return while one is under way (Sync, SyncPending, Close).
	// Taken before mu.
	syncMu sync.Mutex
	mu     sync.Mutex
	lockf  *os.File
	headf  *os.File // PATH.head, rewritten after each append
	f      *os.File
	fid    fileID
	closed bool
	dirty  bool
	// syncErr is the first failed fsync of appended events outside Sync
	// (the interval's, SyncPending's). Close reports it: on Linux a later
	// fsync of the file can succeed although what the failed one was to
	// write is gone, so the failure must not be forgotten.
	syncErr error
	// What the file ended with after our last append, so that the next
	// append can skip re-reading it when nobody else has written.
	cacheOK   bool
	cacheSize int64
	lastSeq   uint64
	lastHash  string
	// mismatch, when set, says how the log on disk disagreed with its
	// head record; the next append records it first (ActionHeadMismatch).
	mismatch string
	// headEmpty: the head record held nothing when last read (a new log,
	// or one written before head records).
	headEmpty bool

	stop chan struct{}
	done chan struct{}
}

// Open opens (creating with mode 0600 if needed) the log at path for
// appending. The directory must exist. It fails with an error wrapping
// ErrMalformed when the file's last line is not an audit event. ctx
// bounds the wait for the append lock, which another process may hold.
func Open(ctx context.Context, path string, opts ...Option) (*Logger, error) {
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
	if err := flock.Lock(ctx, lockf); err != nil {
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

func (l *Logger) syncLoop(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.syncInterval()
		}
	}
}

// syncInterval fsyncs what was appended since the last fsync. The fsync
// runs outside mu: an append that comes meanwhile (a command's next
// event) writes its line and goes on, instead of waiting milliseconds
// for the disk, and marks the log dirty again for the next tick. What
// the interval promises is unchanged: every line written before the
// fsync began is on disk when it returns.
func (l *Logger) syncInterval() {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	if !l.dirty || l.closed {
		l.mu.Unlock()
		return
	}
	f := l.f
	l.dirty = false
	l.mu.Unlock()
	if intervalSyncHook != nil {
		intervalSyncHook()
	}
	// A rotation meanwhile replaces l.f: it fsyncs the old file before
	// its rename, and the old descriptor stays open until this fsync
	// returns (os.File counts the calls under way).
	if err := f.Sync(); err != nil {
		l.o.log.Error("audit log fsync failed", "path", l.path, "err", err)
		l.mu.Lock()
		l.failedSync(err)
		l.mu.Unlock()
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
	first := l.lastSeq
	if l.mismatch != "" {
		// Say so in the chain itself before going on from what is left:
		// the appends that follow must not hide the cut.
		events = append([]Event{{Action: ActionHeadMismatch, Decision: "deny", Target: filepath.Base(l.path),
			Reason: "head_mismatch", Detail: l.mismatch}}, events...)
	}
	buf, seq, prev, err := l.chain(events)
	if err != nil {
		return err
	}
	if l.o.maxSize > 0 && size > 0 && size+int64(len(buf)) > l.o.maxSize {
		if err := l.rotate(first); err != nil {
			return err
		}
		size = 0
	}
	return l.write(buf, size, seq, prev)
}

// write appends the lines buf to the live file, which is size bytes long,
// syncs them as the durability asks, and makes (seq, prev) the chain head
// in memory and in the head record. Call with the lock.
func (l *Logger) write(buf []byte, size int64, seq uint64, prev string) error {
	if l.o.key != nil && l.headEmpty && l.mismatch == "" {
		// A keyed log without a head record fails Verify, and the next
		// writer records the loss: so a keyed line is never written while
		// the head record is empty. Naming the chain head as it is before
		// these lines (seq 0 for a new log) leaves the head behind the
		// log if we die before the update below, which is accepted, and
		// claims the record's space before a full disk could refuse it.
		if _, err := l.headf.WriteAt(encodeHead(l.o.key, l.lastSeq, l.lastHash), 0); err != nil {
			return fmt.Errorf("audit: write head record: %w", err)
		}
		l.headEmpty = false
	}
	if n, err := l.f.Write(buf); err != nil {
		// Take a partial batch back out so that the next append does not
		// glue onto it; if that fails too, the next append repairs a torn
		// line but keeps the whole ones (see RecordBatch).
		if n > 0 {
			_ = l.f.Truncate(size)
			l.dirty = true
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
	if headHook != nil {
		headHook()
	}
	// The head goes after the lines: a crash between the two leaves it
	// behind the log, which Verify accepts, never ahead of it.
	if _, err := l.headf.WriteAt(encodeHead(l.o.key, seq, prev), 0); err != nil {
		l.o.log.Error("audit head record not updated; a cut of the newest events would go unseen", "path", l.path, "err", err)
	} else {
		l.headEmpty = false
	}
	return nil
}

// intervalSyncHook is nil outside tests; the tests set it to hold an
// interval fsync under way.
var intervalSyncHook func()

// headHook is nil outside tests; the crash tests set it in a re-executed
// test binary to SIGKILL the process after the lines of an append are
// written and before the head record is updated.
var headHook func()

// Sync forces what was recorded so far to stable storage, whatever the
// durability option.
func (l *Logger) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
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

// SyncPending fsyncs what was recorded since the last fsync, as Close
// would: nothing under NoSync, nor under SyncEachEvent (every append was
// synced), nor when nothing is pending. A caller with other work before
// Close runs it beside that work.
func (l *Logger) SyncPending() error {
	// An interval fsync under way has cleared dirty: wait for it, so
	// that what it covers is on disk when this returns.
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.o.durability.mode != modeInterval || !l.dirty {
		return nil
	}
	if err := l.f.Sync(); err != nil {
		l.failedSync(err)
		return fmt.Errorf("audit: fsync: %w", err)
	}
	l.dirty = false
	return nil
}

// failedSync (l.mu held) keeps the first failed fsync for Close.
func (l *Logger) failedSync(err error) {
	if l.syncErr == nil {
		l.syncErr = fmt.Errorf("audit: fsync: %w", err)
	}
}

// Close syncs what is not yet synced (unless NoSync) and closes the log.
// It reports an earlier fsync of the log that failed, even when its own
// succeeds. It is idempotent.
func (l *Logger) Close() error {
	// After an interval fsync under way, whose failure Close reports.
	l.syncMu.Lock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.syncMu.Unlock()
		return nil
	}
	l.closed = true
	stop, done := l.stop, l.done
	var err error
	// Under SyncEvery, only what was written since the last fsync needs
	// one: after a SyncPending or Sync nothing may be left, and a second
	// fsync of a clean file can still cost a device cache flush.
	if l.o.durability.mode == modeEvent || (l.o.durability.mode == modeInterval && l.dirty) {
		err = l.f.Sync()
	}
	if err == nil {
		err = l.syncErr
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
	// Released before waiting for the loop, which may be waiting for it.
	l.syncMu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	return err
}
