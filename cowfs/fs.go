package cowfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/pathguard"
)

// Defaults of the limits, matching the Python implementation.
const (
	DefaultMaxFileBytes   int64 = 50 << 20
	DefaultMaxStagedBytes int64 = 256 << 20
	// DefaultMaxOpenTx is 0: no bound on open transactions. A session
	// stacks one per command; the facade squashes a long stack instead.
	DefaultMaxOpenTx  = 0
	DefaultMaxChanges = 100000
	DefaultUndoDepth  = 16
)

// StateDir is where cowfs keeps its state, relative to the workspace.
const StateDir = pathguard.ReservedDir + "/cow"

type options struct {
	logger         *slog.Logger
	maxFileBytes   int64
	maxStagedBytes int64
	maxOpenTx      int
	maxChanges     int
	undoDepth      int
	lane           string // lane.go
	// guardWrite: the write bits WithoutNewWriteBits guards.
	guardWrite uint32
}

// Option configures an FS.
type Option func(*options) error

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("cowfs: nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithMaxFileBytes bounds the size of one staged file.
func WithMaxFileBytes(n int64) Option {
	return positive("max file bytes", n, func(o *options) *int64 { return &o.maxFileBytes })
}

// WithMaxStagedBytes bounds the bytes staged by all open transactions of
// the workspace together.
func WithMaxStagedBytes(n int64) Option {
	return positive("max staged bytes", n, func(o *options) *int64 { return &o.maxStagedBytes })
}

// WithMaxOpenTransactions bounds how many transactions may be open at once
// in the workspace (by default there is no bound).
func WithMaxOpenTransactions(n int) Option {
	return positive("max open transactions", n, func(o *options) *int { return &o.maxOpenTx })
}

// WithMaxChanges bounds how many paths one transaction may change.
func WithMaxChanges(n int) Option {
	return positive("max changes", n, func(o *options) *int { return &o.maxChanges })
}

// positive is the option that sets the bound field(o) to n. A bound of zero
// would refuse everything rather than mean "unbounded", so n must be
// positive.
func positive[T int | int64](what string, n T, field func(*options) *T) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("cowfs: %s %d must be positive", what, n)
		}
		*field(o) = n
		return nil
	}
}

// WithUndoDepth sets how many committed transactions are kept for Undo;
// older undo entries are deleted after each commit.
func WithUndoDepth(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("cowfs: undo depth %d must not be negative", n)
		}
		o.undoDepth = n
		return nil
	}
}

// WithoutNewWriteBits makes a write or mkdir stage the write bits of bits
// (0o022: group and other; 0o002: other only) only where the workspace
// entry it replaces (a file for a write, a directory for a mkdir) already
// has them, bit by bit: a command that made a directory 0777 or a file
// 0666 must not leave it writable by the other users of the machine (who
// could then plant objects or move a branch in .git) once it is
// committed. Without it, staged modes are committed as given.
func WithoutNewWriteBits(bits os.FileMode) Option {
	return func(o *options) error {
		if bits&^0o022 != 0 {
			return fmt.Errorf("cowfs: WithoutNewWriteBits(%#o): only group (0o020) and other (0o002) write can be guarded", uint32(bits))
		}
		o.guardWrite = uint32(bits)
		return nil
	}
}

// TxState is where a transaction is in its life.
type TxState string

// The transaction states, as List reports them.
const (
	// StateOpen: staging; may be committed or discarded. When its last
	// commit failed and was rolled back, Reason says why.
	StateOpen TxState = "open"
	// StateCommitting: its WAL is written and it is being applied, by a
	// live process or, after a crash, by the next Open.
	StateCommitting TxState = "committing"
	// StateQuarantined: recovery refused its WAL; it is kept untouched for
	// a person to look at. Reason says why.
	StateQuarantined TxState = "quarantined"
	// StateCommitted: applied, and kept in the undo journal.
	StateCommitted TxState = "committed"
)

// TxInfo describes a transaction.
type TxInfo struct {
	ID          string    `json:"id"`
	Lane        string    `json:"lane,omitempty"` // DefaultLane when empty (lane.go)
	Description string    `json:"description"`
	State       TxState   `json:"state"`
	Created     time.Time `json:"created"`
	Committed   time.Time `json:"committed,omitzero"`
	Changes     int       `json:"changes"`
	// Whiteouts counts the paths an open transaction hides from the
	// pending stack below it (staged there, not in the workspace): changes
	// its diff shows that Changes does not count.
	Whiteouts int    `json:"whiteouts,omitempty"`
	Bytes     int64  `json:"bytes"`
	Reason    string `json:"reason,omitempty"`
}

// FS is the copy-on-write staging area of one workspace. Its state lives
// under <workspace>/.pulse/cow, so other processes (a review tool, a later
// run) see the same transactions. Methods are safe for concurrent use,
// also across processes.
type FS struct {
	ws    *workspace
	state *os.Root
	opts  options
	log   *slog.Logger

	// op serialises this process's holders of the flock: the flock
	// alone excludes them too, but the race detector and the memory
	// model only know Go's own primitives. It is a one-slot semaphore
	// rather than a mutex so that waiting for it honours ctx, as the
	// flock wait does.
	op chan struct{}

	mu      sync.Mutex
	closed  bool
	staged  int64            // bytes staged by open transactions, as this FS knows them
	counted map[string]int64 // per transaction, the bytes included in staged
	// countedAll says staged has been counted from the stage logs once
	// (recount). Until a limit check needs it, nobody does: counting
	// reads every open transaction's log, which an Open for a command
	// that stages nothing (or a review listing) would pay per pending
	// transaction.
	countedAll  bool
	recoveryErr error

	stackTxs  map[string]*Tx      // the pending stack as last read (stack.go), while holding op
	scache    stackCache          // what was derived from it (stack.go)
	dirStamps map[string]dirStamp // while holding op (stack.go)
	laneCache map[string]laneRec  // while holding op (lane.go)
	// lastStack is the last stack read without lanes, and lastIDs the
	// transaction ids it was read from (stack.go); while holding op.
	lastStack *Stack
	lastIDs   []string
	// lastGen is the generation lastStack was read at, and lastTxDir
	// the tx directory then (stackgen.go); while holding op.
	lastGen   []byte
	lastTxDir dirStamp
	// laneHolds are lane records flock'd shared while the FS is open
	// (lanegc.go): its own lane's, and those of the lanes it forked.
	laneHolds []*os.File
}

// Open opens (creating if needed) the staging area of workspace and rolls
// forward any commit a crashed process left half done. A commit that
// cannot be rolled forward is quarantined, not fatal: Open still succeeds
// and RecoveryErr reports it.
func Open(ctx context.Context, workspace string, opts ...Option) (*FS, error) {
	o := options{
		logger:         slog.New(slog.DiscardHandler),
		maxFileBytes:   DefaultMaxFileBytes,
		maxStagedBytes: DefaultMaxStagedBytes,
		maxOpenTx:      DefaultMaxOpenTx,
		maxChanges:     DefaultMaxChanges,
		undoDepth:      DefaultUndoDepth,
	}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	ws, err := openWorkspace(workspace)
	if err != nil {
		return nil, err
	}
	f := &FS{ws: ws, opts: o, log: o.logger, op: make(chan struct{}, 1), counted: map[string]int64{}}
	if err := f.openState(); err != nil {
		ws.close()
		return nil, err
	}
	if err := f.recover(ctx); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.checkLaneOpen(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (f *FS) openState() error {
	// .pulse must be a real directory of the workspace, not a symlink
	// that would put cowfs state (and the undo journal) somewhere else.
	for _, d := range []string{pathguard.ReservedDir, StateDir} {
		fi, err := f.ws.root.Lstat(d)
		if isNotExist(err) {
			if err := f.ws.root.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cowfs: create %s: %w", d, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("cowfs: %s: %w", d, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("cowfs: %s is not a directory", d)
		}
	}
	st, err := f.ws.root.OpenRoot(StateDir)
	if err != nil {
		return fmt.Errorf("cowfs: open %s: %w", StateDir, err)
	}
	f.state = st
	for _, d := range []string{"tx", "done", "trash"} {
		if err := st.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cowfs: create %s/%s: %w", StateDir, d, err)
		}
	}
	return nil
}

// Workspace returns the workspace directory, absolute and with symlinks
// resolved.
func (f *FS) Workspace() string { return f.ws.dir }

// RecoveryErr returns the commits Open could not roll forward (joined,
// each wrapping ErrRecovery), or nil.
func (f *FS) RecoveryErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recoveryErr
}

// Close releases the FS. Transactions stay on disk. Close is idempotent.
func (f *FS) Close() error {
	f.releaseLane()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.state != nil {
		f.state.Close()
	}
	return f.ws.close()
}

func (f *FS) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// lock takes the workspace-wide advisory lock that serialises every
// change to the staging area and to the workspace made by cowfs, in this
// and other processes. flock locks belong to the open file description,
// so two goroutines (each opening the file) exclude each other too.
//
// Every holder but a reader of the stack (lockRead) is taken to change
// the staging area: the lock gives the stack a new generation before the
// holder does anything (stackgen.go).
func (f *FS) lock(ctx context.Context) (func(), error) {
	unlock, _, err := f.lockGen(ctx, true)
	return unlock, err
}

// lockGen is lock; bump false leaves the generation as it is (making
// one if there is none) and returns it.
func (f *FS) lockGen(ctx context.Context, bump bool) (func(), []byte, error) {
	if f.isClosed() {
		return nil, nil, ErrClosed
	}
	select {
	case f.op <- struct{}{}:
	default:
		select {
		case f.op <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	release := func() { <-f.op }
	lf, err := f.state.OpenFile("lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("cowfs: lock: %w", err)
	}
	if err := flock.Lock(ctx, lf); err != nil {
		lf.Close()
		release()
		if err == ctx.Err() {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("cowfs: lock: %w", err)
	}
	unlock := func() {
		flock.Unlock(lf)
		lf.Close()
		release()
	}
	var gen []byte
	if bump {
		_, err = newGen(lf)
	} else {
		gen, err = readGen(lf)
	}
	if err != nil {
		unlock()
		return nil, nil, fmt.Errorf("cowfs: lock: %w", err)
	}
	return unlock, gen, nil
}

func newID() string {
	return randhex.String(8)
}

// validID reports whether id is a transaction id: 16 lowercase hex digits.
// Ids reach file names, so anything else is refused before it does.
func validID(id string) bool { return lowerHex(id, 16) }

// lowerHex reports whether s is n lowercase hex digits, as cowfs writes
// transaction ids and SHA-256 sums (and so the only spelling it accepts
// back from its state files).
func lowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// account records that transaction id now holds bytes staged bytes and
// updates the workspace total by the difference, refusing (when check is
// set) to grow it past the limit. The total is kept incrementally, from
// the stage records this FS writes or reads, never by rescanning.
func (f *FS) account(id string, bytes int64, check bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delta := bytes - f.counted[id]
	if check && delta > 0 && f.staged+delta > f.opts.maxStagedBytes {
		return &LimitError{Name: LimitStagedBytes, Value: f.opts.maxStagedBytes}
	}
	f.staged += delta
	if bytes == 0 {
		delete(f.counted, id)
	} else {
		f.counted[id] = bytes
	}
	return nil
}

// countStaged makes the staged-bytes total known before a limit check:
// counted from the stage logs the first time (recount), kept up to date
// incrementally after that (account). The caller holds the lock.
func (f *FS) countStaged() error {
	f.mu.Lock()
	done := f.countedAll
	f.mu.Unlock()
	if done {
		return nil
	}
	return f.recount()
}

// recount rebuilds the staged-bytes total from the stage logs of the open
// transactions. The caller holds the lock.
func (f *FS) recount() error {
	ids, err := f.txIDs()
	if err != nil {
		return err
	}
	var staged int64
	counted := map[string]int64{}
	for _, id := range ids {
		if st, _ := f.txState(id); st != StateOpen {
			continue
		}
		t := &Tx{fs: f, id: id, changes: map[string]*change{}}
		if err := t.load(); err != nil || t.bytes == 0 {
			continue
		}
		staged += t.bytes
		counted[id] = t.bytes
	}
	f.mu.Lock()
	f.staged, f.counted, f.countedAll = staged, counted, true
	f.mu.Unlock()
	return nil
}

// Begin starts a transaction. It is on disk, and visible to other
// processes, when Begin returns.
func (f *FS) Begin(ctx context.Context, description string) (*Tx, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ids, err := f.txIDs()
	if err != nil {
		return nil, err
	}
	if f.opts.maxOpenTx > 0 && len(ids) >= f.opts.maxOpenTx {
		return nil, &LimitError{Name: LimitOpenTx, Value: int64(f.opts.maxOpenTx)}
	}
	created := time.Now().UTC()
	// A fork sees its parent's transactions created up to the fork point
	// (lane.go): one begun later must sort after it even if the clock
	// stepped back since.
	if ls, err := f.readLanesLocked(); err == nil {
		for _, r := range ls.recs {
			if c := time.Unix(0, r.Cut+1).UTC(); !created.After(c) {
				created = c
			}
		}
	}
	t := &Tx{fs: f, id: newID(), lane: f.opts.lane, desc: description, created: created, changes: map[string]*change{}}
	if err := f.createTx(t, nil, nil); err != nil {
		return nil, err
	}
	return t, nil
}

// createTx writes a new transaction directory under a hidden name and
// renames it into place, so a crash never leaves half a transaction.
// blobs are hard-linked (or copied) into it; recs follow the begin record.
func (f *FS) createTx(t *Tx, recs []stageRec, blobs map[string]string) error {
	tmp := "tx/.new-" + t.id
	if err := f.state.MkdirAll(tmp+"/blobs", 0o700); err != nil {
		return fmt.Errorf("cowfs: begin: %w", err)
	}
	for sha, src := range blobs {
		if err := f.linkOrCopy(src, tmp+"/blobs/"+sha); err != nil {
			f.state.RemoveAll(tmp)
			return fmt.Errorf("cowfs: begin: %w", err)
		}
	}
	var buf []byte
	begin := stageRec{Op: "begin", ID: t.id, Desc: t.desc, Created: t.created.UnixNano(), Undoes: t.undoes, Squashes: t.squashes, Lane: t.lane, Sealed: true}
	all := append([]stageRec{begin}, recs...)
	for _, r := range all {
		p, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
	}
	// The stage log, the seal, blobs/ (its links) and the directory
	// itself (their names) must all be durable before the rename makes
	// the transaction visible, but in no order among themselves: they are
	// fsynced together, one wait for the device instead of four in a row.
	names, data := []string{"stage.log", "seal"}, [][]byte{buf, newSeal(uint64(len(buf)))}
	if t.undoes != "" {
		// Recovery finds an undo that did not commit by this name in the
		// directory listing it makes anyway (dropStrayUndo), instead of
		// reading every open transaction's stage log at every Open.
		names, data = append(names, undoMarker), append(data, []byte(t.undoes+"\n"))
	}
	if err := f.writeNewSynced(tmp, names, data, "blobs"); err != nil {
		f.state.RemoveAll(tmp)
		return fmt.Errorf("cowfs: begin: %w", err)
	}
	if err := f.state.Rename(tmp, "tx/"+t.id); err != nil {
		f.state.RemoveAll(tmp)
		return fmt.Errorf("cowfs: begin: %w", err)
	}
	if err := f.syncState("tx"); err != nil {
		return err
	}
	for _, r := range recs {
		t.apply(r)
	}
	t.offset = int64(len(buf))
	t.loaded, t.sealed, t.sealSeq = true, true, 1
	return nil
}

func (f *FS) linkOrCopy(src, dst string) error {
	if err := f.state.Link(src, dst); err == nil {
		return nil
	}
	in, err := f.state.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return f.createSync(dst, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

// writeFileSync writes name in the state directory and fsyncs it.
func (f *FS) writeFileSync(name string, data []byte) error {
	return f.createSync(name, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// createSync creates (or truncates) name in the state directory, mode
// 0600, lets fill write it, and fsyncs it before it is closed, so that a
// caller that goes on to rename or record it knows its bytes are on disk.
func (f *FS) createSync(name string, fill func(io.Writer) error) error {
	fl, err := f.state.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := fill(fl); err != nil {
		fl.Close()
		return err
	}
	if err := fl.Sync(); err != nil {
		fl.Close()
		return err
	}
	return fl.Close()
}

// replaceFileSync atomically replaces name with data: temp, fsync,
// rename, fsync of the directory.
func (f *FS) replaceFileSync(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := f.writeFileSync(tmp, data); err != nil {
		f.state.Remove(tmp) // what it holds of data is of no use, and takes room
		return err
	}
	if err := f.state.Rename(tmp, name); err != nil {
		return err
	}
	return f.syncState(path.Dir(name))
}

// writeNewSynced creates each of names in dir with its data, and returns
// once they, the directory dir/sub (unless sub is "") and dir itself are
// durable. The fsyncs are issued at once (syncTogether): what the caller
// does next (a rename, a record pointing at them) needs all of them and
// no order among them.
func (f *FS) writeNewSynced(dir string, names []string, data [][]byte, sub string) (err error) {
	var files []*os.File
	defer func() {
		for _, fl := range files {
			if cerr := fl.Close(); err == nil {
				err = cerr
			}
		}
	}()
	for i, n := range names {
		fl, err := f.state.OpenFile(dir+"/"+n, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		files = append(files, fl)
		if _, err := fl.Write(data[i]); err != nil {
			return err
		}
	}
	dirs := []string{dir}
	if sub != "" {
		dirs = append(dirs, dir+"/"+sub)
	}
	for _, d := range dirs {
		fl, err := f.state.Open(d)
		if err != nil {
			return fmt.Errorf("cowfs: sync %s: %w", d, err)
		}
		files = append(files, fl)
	}
	return syncTogether(files...)
}

// syncTogether fsyncs files at once, one goroutine each, and returns when
// every fsync has returned: nil only when all succeeded. For files that
// must all be durable before the next step but in no order among
// themselves, so that the device serves the flushes together rather than
// one wait after another.
func syncTogether(files ...*os.File) error {
	if len(files) == 1 {
		return files[0].Sync()
	}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, fl := range files[1:] {
		wg.Go(func() { errs[i+1] = fl.Sync() })
	}
	errs[0] = files[0].Sync()
	wg.Wait()
	return errors.Join(errs...)
}

func (f *FS) syncState(dir string) error {
	d, err := f.state.Open(dir)
	if err != nil {
		return fmt.Errorf("cowfs: sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cowfs: sync %s: %w", dir, err)
	}
	return nil
}

// readDirNames lists a state directory, skipping hidden entries (the
// names cowfs uses while it builds something).
func (f *FS) readDirNames(dir string) ([]string, error) {
	d, err := f.state.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := names[:0]
	for _, n := range names {
		if !strings.HasPrefix(n, ".") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f *FS) txIDs() ([]string, error) { return f.stateNames("tx", validID) }

// doneEntries lists the undo journal, oldest first. Names are
// "<20-digit sequence>-<id>".
func (f *FS) doneEntries() ([]string, error) {
	return f.stateNames("done", func(n string) bool { _, _, ok := parseDone(n); return ok })
}

// stateNames lists a state directory (readDirNames), keeping the names
// keep accepts: what else is there is not cowfs's.
func (f *FS) stateNames(dir string, keep func(string) bool) ([]string, error) {
	names, err := f.readDirNames(dir)
	if err != nil {
		return nil, fmt.Errorf("cowfs: list: %w", err)
	}
	return slices.DeleteFunc(names, func(n string) bool { return !keep(n) }), nil
}

func parseDone(name string) (seq uint64, id string, ok bool) {
	s, id, found := strings.Cut(name, "-")
	if !found || len(s) != 20 || !validID(id) {
		return 0, "", false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return n, id, true
}

// Tx loads the transaction id, which may have been begun by another
// process. Committed and discarded ids are not found.
func (f *FS) Tx(ctx context.Context, id string) (*Tx, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: transaction %q", ErrNotFound, id)
	}
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	t := &Tx{fs: f, id: id, changes: map[string]*change{}}
	if err := t.refreshLocked(false); err != nil {
		return nil, err
	}
	return t, nil
}

// List returns the open, committing and quarantined transactions, then
// the committed ones kept for Undo (newest last).
func (f *FS) List(ctx context.Context) ([]TxInfo, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ids, err := f.txIDs()
	if err != nil {
		return nil, err
	}
	var out []TxInfo
	for _, id := range ids {
		t := &Tx{fs: f, id: id, changes: map[string]*change{}}
		if err := t.load(); err != nil {
			out = append(out, TxInfo{ID: id, State: StateQuarantined, Reason: err.Error()})
			continue
		}
		info := t.info()
		info.State, info.Reason = f.txState(id)
		out = append(out, info)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	done, err := f.doneEntries()
	if err != nil {
		return nil, err
	}
	for _, name := range done {
		info, err := f.doneInfo(name)
		if err != nil {
			f.log.Warn("cowfs: unreadable undo entry", "entry", name, "err", err)
			continue
		}
		out = append(out, info)
	}
	return out, nil
}

// txState reads the markers of an existing transaction directory.
func (f *FS) txState(id string) (TxState, string) {
	st, reason, _ := f.txStateNames(id)
	return st, reason
}

// txNames is the listing of a transaction's directory; nil when it could
// not be listed.
type txNames map[string]bool

// may reports whether name may be in the directory: it was listed, or
// nothing was.
func (n txNames) may(name string) bool { return n == nil || n[name] }

// txStateNames is txState, and the names in the transaction's directory.
// It lists the directory once and looks only at the marker files the
// listing holds: each lookup through the state root opens every
// directory on its way, and an Open looks at every pending transaction.
// A marker made after the listing is missed, as one made after its own
// lookup would be.
func (f *FS) txStateNames(id string) (TxState, string, txNames) {
	dir := "tx/" + id
	var has txNames
	if names, err := f.readDirNames(dir); err == nil {
		has = make(txNames, len(names))
		for _, n := range names {
			has[n] = true
		}
	}
	if has.may("quarantine") {
		if b, err := f.state.ReadFile(dir + "/quarantine"); err == nil {
			return StateQuarantined, strings.TrimSpace(string(b)), has
		}
	}
	if has.may("wal") {
		if _, err := f.state.Lstat(dir + "/wal"); err == nil {
			return StateCommitting, "", has
		}
	}
	if has.may("failed") {
		if b, err := f.state.ReadFile(dir + "/failed"); err == nil {
			return StateOpen, "last commit failed and was rolled back: " + strings.TrimSpace(string(b)), has
		}
	}
	return StateOpen, "", has
}

func (f *FS) doneInfo(name string) (TxInfo, error) {
	seq, id, _ := parseDone(name)
	b, err := f.state.ReadFile("done/" + name + "/wal")
	if err != nil {
		return TxInfo{}, err
	}
	w, err := decodeWAL(b)
	if err != nil {
		return TxInfo{}, err
	}
	info := TxInfo{ID: id, Description: w.Desc, State: StateCommitted,
		Created: time.Unix(0, w.Created).UTC(), Committed: time.Unix(0, int64(seq)).UTC(), Changes: len(w.Ops)}
	for _, op := range w.Ops {
		info.Bytes += op.Size
	}
	return info, nil
}
