package cowfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/internal/fsmode"
	"golang.org/x/sys/unix"
)

// KindWhiteout is an Op kind for Tx.Stage: delete a path as a command saw
// it through the pending stack. When the workspace or the transaction
// holds the path it is an ordinary deletion; otherwise the path came from
// a transaction lower in the stack, and the transaction records a
// whiteout: the path (and everything beneath) is absent from the view of
// every command stacked on it, and nothing is written by a commit.
const KindWhiteout ChangeKind = "whiteout"

// WhiteoutOp is a deletion of path as seen through the pending stack.
func WhiteoutOp(path string) Op { return Op{Kind: KindWhiteout, Path: path} }

// ErrStackDependency: a transaction in the middle of the pending stack
// cannot be committed or discarded alone, because another pending
// transaction changes the same paths (see StackError).
var ErrStackDependency = errors.New("cowfs: pending transactions depend on each other")

// StackError names the transactions that stand in the way of committing
// or discarding one transaction of the stack alone. It wraps
// ErrStackDependency.
type StackError struct {
	Op     string   // "commit" or "discard"
	ID     string   // the transaction asked for
	Others []string // the pending transactions sharing its paths
	Path   string   // one shared path
}

func (e *StackError) Error() string {
	hint := "commit them together (pulse cow commit --all) or squash the stack first"
	if e.Op == "discard" {
		hint = "discard those first (they were made on top of it), or discard --all"
	}
	return fmt.Sprintf("cowfs: cannot %s transaction %s alone: pending transaction(s) %s also change %q; %s",
		e.Op, e.ID, strings.Join(e.Others, ", "), e.Path, hint)
}

// Unwrap makes errors.Is(err, ErrStackDependency) true.
func (e *StackError) Unwrap() error { return ErrStackDependency }

// planWhiteout plans a WhiteoutOp: an ordinary deletion when the
// workspace or the transaction has the path, else a whiteout record.
func (t *Tx) planWhiteout(rel string) ([]stageRec, error) {
	if t.cur(rel) != nil {
		return t.planDelete(rel)
	}
	if _, err := t.fs.ws.lstat(rel); err == nil {
		return t.planDelete(rel)
	} else if !isNotExist(err) && !errors.Is(err, ErrInvalidPath) {
		return nil, err
	}
	return []stageRec{{Op: "whiteout", Path: rel}}, nil
}

func (t *Tx) applyWhiteout(rel string) {
	if t.whiteouts == nil {
		t.whiteouts = map[string]bool{}
	}
	t.whiteouts[rel] = true
}

// Whiteouts returns the paths the transaction hides from the stack below
// it without changing the workspace, sorted.
func (t *Tx) Whiteouts() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.whiteouts))
	for p := range t.whiteouts {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Empty reports whether the transaction holds neither changes nor
// whiteouts.
func (t *Tx) Empty() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.changes) == 0 && len(t.whiteouts) == 0
}

// StackTx is one transaction of the pending stack, as Stack read it.
type StackTx struct {
	ID          string
	Lane        string // the lane that made it (DefaultLane: "")
	Description string
	Created     time.Time
	Changes     int
	Whiteouts   int
	Bytes       int64
	// Squashes lists the transactions this one replaced.
	Squashes []string

	dir       string
	offset    int64
	changes   []change // sorted by path
	whiteouts []string // sorted
}

// Empty reports whether the transaction holds nothing (a command that is
// still running has an empty one).
func (s *StackTx) Empty() bool { return len(s.changes) == 0 && len(s.whiteouts) == 0 }

// DamagedTx is a pending transaction left out of the stack because it
// cannot be read (or was quarantined by recovery).
type DamagedTx struct {
	ID  string
	Err error
}

// Stack is the ordered stack of a workspace's pending transactions, read
// at one instant under the workspace lock, so that it never holds part of
// a transaction (a batch is read whole or not at all). Transactions are
// ordered by creation time, then id: whichever process began them. A
// command runs on the workspace plus every transaction, bottom first.
type Stack struct {
	fs      *FS
	Txs     []*StackTx // bottom first
	Damaged []DamagedTx

	lane  string
	all   []*StackTx // every lane's, bottom first (lane.go)
	lanes *laneSet

	key  string // the ids and log lengths of the non-empty Txs: equal keys, equal views
	view *fold  // of all of Txs, built on first use
}

// stackCache keeps what was derived from the last stacks read, so that a
// command on an unchanged stack of hundreds of transactions does not
// rebuild them: each transaction's entries by id and log length, and the
// fold and layers of the last stack key. Folds and layers are never
// changed once built, so sharing them between Stacks is safe.
type stackCache struct {
	mu     sync.Mutex
	txs    map[string]*StackTx
	key    string
	view   *fold
	layers map[string]Layer // by layer id
	last   []Layer          // the layers of key
}

// Key identifies the stack's content: two stacks with the same key hold
// the same non-empty transactions with the same changes.
func (s *Stack) Key() string { return s.key }

// Stack reads the pending stack. Transactions listed by a squash that
// replaced them (left behind when a squash was interrupted) are removed
// first. A transaction that cannot be read, is quarantined, or is being
// committed is left out: the first two are reported in Damaged and
// logged as warnings, never merged.
func (f *FS) Stack(ctx context.Context) (*Stack, error) {
	// A reader: the generation stays, and says whether anything changed
	// since the last stack read (stackgen.go).
	unlock, gen, err := f.lockGen(ctx, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if st := f.unchangedStack(gen); st != nil {
		return st, nil
	}
	return f.stackAt(gen)
}

// stackLocked reads the stack for a holder of the lock that changes the
// staging area.
func (f *FS) stackLocked() (*Stack, error) { return f.stackAt(nil) }

// stackAt reads the stack; gen is the generation the caller found under
// the lock, nil when it holds the lock to change the staging area (the
// stack read is then not kept as unchanged at any generation).
func (f *FS) stackAt(gen []byte) (*Stack, error) {
	// The tx directory is stamped before it is listed: a change after
	// the stamp makes the next read's stamp differ.
	var txDir dirStamp
	stamped := false
	if d, err := f.state.Open("tx"); err == nil {
		txDir, stamped = txDirStamp(int(d.Fd()))
		d.Close()
	}
	ids, err := f.txIDs()
	if err != nil {
		return nil, err
	}
	if f.stackTxs == nil {
		f.stackTxs = map[string]*Tx{}
	}
	present := map[string]bool{}
	for _, id := range ids {
		present[id] = true
	}
	for id := range f.stackTxs {
		if !present[id] {
			delete(f.stackTxs, id)
		}
	}
	st := &Stack{fs: f}
	var txs []*Tx
	// A transaction read before whose directory and stage log are as they
	// were costs two fstatat calls; the rest take the full path.
	var dirfd = -1
	if d, err := f.state.Open("tx"); err == nil {
		defer d.Close()
		dirfd = int(d.Fd())
	}
	if f.dirStamps == nil {
		f.dirStamps = map[string]dirStamp{}
	}
	for id := range f.dirStamps {
		if !present[id] {
			delete(f.dirStamps, id)
		}
	}
	fast := 0
	for _, id := range ids {
		if t := f.stackTxs[id]; t != nil && dirfd >= 0 && f.unchangedAt(dirfd, t) {
			txs = append(txs, t)
			fast++
			continue
		}
		state, reason := f.txState(id)
		switch state {
		case StateCommitting:
			continue
		case StateQuarantined:
			st.Damaged = append(st.Damaged, DamagedTx{ID: id, Err: fmt.Errorf("%w: transaction %s is quarantined: %s", ErrRecovery, id, reason)})
			continue
		}
		t := f.stackTxs[id]
		if t == nil {
			t = &Tx{fs: f, id: id, changes: map[string]*change{}}
		} else if t.unchangedLocked() {
			txs = append(txs, t)
			if dirfd >= 0 {
				// Stamped now if its directory is old enough, so
				// that the next read takes the two-fstatat path: a
				// transaction read within 2 s of its last change
				// (the next command's, in a session) would
				// otherwise never be.
				f.stampAt(dirfd, t)
			}
			continue
		}
		if err := t.refreshLocked(false); err != nil {
			delete(f.stackTxs, id)
			if errors.Is(err, ErrNotFound) || errors.Is(err, ErrClosed) {
				continue
			}
			st.Damaged = append(st.Damaged, DamagedTx{ID: id, Err: err})
			continue
		}
		f.stackTxs[id] = t
		txs = append(txs, t)
		if dirfd >= 0 {
			f.stampAt(dirfd, t)
		}
	}
	// The same transactions as last time, none changed, and no lanes
	// to read: the stack is the last one (its slices are never changed
	// once made), without sorting and keying it again.
	if last := f.lastStack; last != nil && fast == len(ids) && slices.Equal(ids, f.lastIDs) {
		f.keepStack(last, ids, gen, txDir, stamped)
		return &Stack{fs: f, Txs: last.Txs, lane: last.lane, all: last.all, lanes: last.lanes, key: last.key}, nil
	}
	f.lastStack, f.lastIDs, f.lastGen = nil, nil, nil
	// A squash writes its result before it removes what it replaced; a
	// crash between the two leaves both, and the originals go now.
	replaced := map[string]bool{}
	for _, t := range txs {
		for _, id := range t.squashes {
			if present[id] && id != t.id {
				replaced[id] = true
			}
		}
	}
	if len(replaced) > 0 {
		kept := txs[:0]
		for _, t := range txs {
			if !replaced[t.id] {
				kept = append(kept, t)
				continue
			}
			if err := f.dropLocked(t.id); err != nil {
				return nil, err
			}
		}
		txs = kept
	}
	for _, d := range st.Damaged {
		f.log.Warn("cowfs: a pending transaction is left out of the stack", "tx", d.ID, "err", d.Err)
	}
	c := &f.scache
	c.mu.Lock()
	if c.txs == nil {
		c.txs = map[string]*StackTx{}
	}
	seen := map[string]bool{}
	for _, t := range txs {
		t.mu.Lock()
		off := t.offset
		t.mu.Unlock()
		seen[t.id] = true
		if s := c.txs[t.id]; s != nil && s.offset == off {
			st.Txs = append(st.Txs, s)
			continue
		}
		s := t.stackTx()
		c.txs[t.id] = s
		st.Txs = append(st.Txs, s)
	}
	for id := range c.txs {
		if !seen[id] {
			delete(c.txs, id)
		}
	}
	c.mu.Unlock()
	sort.SliceStable(st.Txs, func(i, j int) bool {
		a, b := st.Txs[i], st.Txs[j]
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.ID < b.ID
	})
	// The lane's stack: its own transactions and what it inherited at
	// each fork (lane.go). Without forks every transaction is the
	// default lane's, and no lane file is read.
	st.lane, st.all = f.opts.lane, st.Txs
	st.lanes = &laneSet{recs: map[string]laneRec{}}
	forked := f.opts.lane != DefaultLane
	for _, t := range st.all {
		forked = forked || t.Lane != DefaultLane
	}
	if forked {
		if st.lanes, err = f.readLanesLocked(); err != nil {
			return nil, err
		}
		if err := st.lanes.check(f.opts.lane); err != nil {
			return nil, err
		}
		st.Txs = st.laneTxs(f.opts.lane)
	}
	// Empty transactions (commands still running) change nothing in the
	// view, so they are not part of the key.
	var kb strings.Builder
	for _, t := range st.Txs {
		if !t.Empty() {
			fmt.Fprintf(&kb, "%s-%x.", t.ID, t.offset)
		}
	}
	st.key = kb.String()
	if !forked && len(st.Damaged) == 0 {
		f.keepStack(st, ids, gen, txDir, stamped)
	}
	return st, nil
}

// dirStamp is what a transaction directory looked like when it was last
// read in full: its identity and mtime (a wal or quarantine marker
// appearing in it changes the mtime).
type dirStamp struct {
	ino, dev     uint64
	mtime, ctime int64 // ctime: the tx directory's only (stackgen.go)
}

// stampAt records t's directory, unless its mtime is too recent to tell
// a later change within the same clock tick apart (as git treats a racy
// index entry).
func (f *FS) stampAt(dirfd int, t *Tx) {
	var st unix.Stat_t
	if unix.Fstatat(dirfd, t.id, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		delete(f.dirStamps, t.id)
		return
	}
	m := st.Mtim.Nano()
	if time.Now().UnixNano()-m < int64(2*time.Second) {
		delete(f.dirStamps, t.id)
		return
	}
	f.dirStamps[t.id] = dirStamp{ino: st.Ino, dev: uint64(st.Dev), mtime: m}
}

// unchangedAt reports that t's directory is as stamped and its stage log
// has not grown: nothing to re-read, no marker to look for.
func (f *FS) unchangedAt(dirfd int, t *Tx) bool {
	want, ok := f.dirStamps[t.id]
	if !ok {
		return false
	}
	var st unix.Stat_t
	if unix.Fstatat(dirfd, t.id, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR ||
		st.Ino != want.ino || uint64(st.Dev) != want.dev || st.Mtim.Nano() != want.mtime {
		return false
	}
	t.mu.Lock()
	loaded, off := t.loaded, t.offset
	t.mu.Unlock()
	if !loaded || unix.Fstatat(dirfd, t.id+"/stage.log", &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == off
}

// unchangedLocked reports, with one stat, that the stage log of a
// transaction read before has not grown since: a stack of hundreds of
// transactions is then re-read at that cost each. The caller holds the
// lock, so no append is half done.
func (t *Tx) unchangedLocked() bool {
	t.mu.Lock()
	loaded, off := t.loaded, t.offset
	t.mu.Unlock()
	if !loaded {
		return false
	}
	fi, err := t.fs.state.Lstat(t.dir() + "/stage.log")
	return err == nil && fi.Mode().IsRegular() && fi.Size() == off
}

// dropLocked removes an open transaction's state; the caller holds the
// lock.
func (f *FS) dropLocked(id string) error {
	if err := f.removeState("tx/" + id); err != nil {
		return err
	}
	f.account(id, 0, false)
	delete(f.stackTxs, id)
	return nil
}

func (t *Tx) stackTx() *StackTx {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &StackTx{ID: t.id, Lane: t.lane, Description: t.desc, Created: t.created, Changes: len(t.changes),
		Whiteouts: len(t.whiteouts), Bytes: t.bytes, Squashes: t.squashes, dir: t.dir(), offset: t.offset}
	s.changes = make([]change, 0, len(t.changes))
	for _, c := range t.changes {
		s.changes = append(s.changes, *c)
	}
	sort.Slice(s.changes, func(i, j int) bool { return s.changes[i].Path < s.changes[j].Path })
	for p := range t.whiteouts {
		s.whiteouts = append(s.whiteouts, p)
	}
	sort.Strings(s.whiteouts)
	return s
}

// fold is the pending stack reduced to one change per path: the topmost
// change's effect with the bottom-most snapshot of the workspace (what a
// commit of the whole stack must find there). kids indexes the entries by
// parent so that replacing a directory drops what was staged beneath it.
type fold struct {
	m    map[string]*fentry
	kids map[string]map[string]bool
}

type fentry struct {
	c   change
	dir string // state dir of the transaction holding the bytes
	tx  string // id of the transaction whose change this entry is (Decider)
	// hide marks a whiteout of a path the workspace did not hold: absent
	// in the view, nothing to commit.
	hide bool
}

func newFold() *fold {
	return &fold{m: map[string]*fentry{}, kids: map[string]map[string]bool{}}
}

func (v *fold) set(p string, e *fentry) {
	v.m[p] = e
	par := path.Dir(p)
	k := v.kids[par]
	if k == nil {
		k = map[string]bool{}
		v.kids[par] = k
	}
	k[p] = true
}

func (v *fold) remove(p string) {
	delete(v.m, p)
	if k := v.kids[path.Dir(p)]; k != nil {
		delete(k, p)
	}
}

// hideBelow makes everything staged beneath p absent: entries the
// workspace never had are dropped, the others become deletions.
func (v *fold) hideBelow(p string) {
	for q := range v.kids[p] {
		v.hideBelow(q)
		e := v.m[q]
		if e == nil {
			continue
		}
		if e.c.Before.Type == typeAbsent {
			v.remove(q)
			continue
		}
		e.c = change{Path: q, Kind: KindDelete, Before: e.c.Before}
		e.hide = false
	}
	if k := v.kids[p]; len(k) == 0 {
		delete(v.kids, p)
	}
}

func (v *fold) apply(t *StackTx) {
	for _, c := range t.changes {
		prev := v.m[c.Path]
		if c.Kind == KindMkdir && c.Implicit && prev != nil && prev.c.Kind == KindMkdir {
			continue // the directory is there already, as staged below
		}
		e := &fentry{c: c, dir: t.dir, tx: t.ID}
		if prev != nil && !prev.hide {
			e.c.Before = prev.c.Before
		}
		if c.Kind != KindMkdir {
			v.hideBelow(c.Path)
		}
		v.set(c.Path, e)
	}
	for _, p := range t.whiteouts {
		v.hideBelow(p)
		if prev := v.m[p]; prev != nil && prev.c.Before.Type != typeAbsent {
			prev.c = change{Path: p, Kind: KindDelete, Before: prev.c.Before}
			prev.hide, prev.tx = false, t.ID
			continue
		}
		v.set(p, &fentry{c: change{Path: p, Kind: KindDelete}, hide: true, tx: t.ID})
	}
}

func (s *Stack) fold() *fold {
	if s.view != nil {
		return s.view
	}
	c := &s.fs.scache
	c.mu.Lock()
	if c.key == s.key && c.view != nil {
		s.view = c.view
		c.mu.Unlock()
		return s.view
	}
	c.mu.Unlock()
	v := foldOf(s.Txs)
	c.mu.Lock()
	c.key, c.view, c.last = s.key, v, nil
	c.mu.Unlock()
	s.view = v
	return v
}

// foldOf folds txs, bottom first.
func foldOf(txs []*StackTx) *fold {
	v := newFold()
	for _, t := range txs {
		v.apply(t)
	}
	return v
}

// Entry is one path of the pending view: what a command sees there
// instead of the workspace.
type Entry struct {
	Path string
	// Kind is KindWrite, KindMkdir, KindSymlink or KindDelete (absent,
	// with everything beneath).
	Kind   ChangeKind
	Mode   fs.FileMode // permission bits of a file or directory
	Size   int64
	Target string // of a symlink
	SHA    string // hex SHA-256 of a file's content

	fs  *FS
	dir string
	c   change
}

// Open returns the content of a KindWrite entry. It fails once the
// transaction holding it is committed or discarded.
func (e *Entry) Open() (io.ReadCloser, error) {
	if e.Kind != KindWrite {
		return nil, fmt.Errorf("cowfs: %q is not a file", e.Path)
	}
	r, cl, err := e.fs.openBlob(e.dir, &e.c)
	if err != nil {
		return nil, err
	}
	return readCloser{r, cl}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

func (s *Stack) entry(e *fentry) Entry {
	out := Entry{Path: e.c.Path, Kind: e.c.Kind, Mode: fs.FileMode(e.c.Mode & 0o777), Size: e.c.Size,
		Target: e.c.Target, SHA: e.c.Blob, fs: s.fs, dir: e.dir, c: e.c}
	if e.c.Kind == KindMkdir {
		out.Mode = fsmode.FromUnix(e.c.Mode)
	}
	return out
}

// View returns the pending view: one entry per path the stack decides,
// sorted by path. A path not listed (and beneath no listed file, symlink
// or deletion) is as the workspace has it.
func (s *Stack) View() []Entry {
	v := s.fold()
	out := make([]Entry, 0, len(v.m))
	for _, e := range v.m {
		out = append(out, s.entry(e))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Lookup says what the stack shows at p: decided is false when the
// workspace shows through; otherwise e is the entry, or nil when p is
// absent (deleted, or beneath a file or a deletion).
func (s *Stack) Lookup(p string) (e *Entry, decided bool, err error) {
	rel, err := cleanRel(s.fs.ws.dir, p)
	if err != nil {
		return nil, false, err
	}
	fe, ancestor := s.deciding(rel)
	switch {
	case ancestor:
		return nil, true, nil
	case fe == nil:
		return nil, false, nil
	case fe.c.Kind == KindDelete:
		return nil, true, nil
	}
	out := s.entry(fe)
	return &out, true, nil
}

// deciding returns the fold's entry that decides rel: an ancestor's that
// deletes or replaces it (ancestor true), else rel's own, else nil.
func (s *Stack) deciding(rel string) (fe *fentry, ancestor bool) {
	v := s.fold()
	for _, a := range ancestors(rel) {
		if fe := v.m[a]; fe != nil && fe.c.Kind != KindMkdir {
			return fe, true
		}
	}
	return v.m[rel], false
}

// Decider returns the id of the transaction whose entry decides what the
// stack shows at p (p's own entry, or an ancestor's that deletes or
// replaces it), or "" when the workspace shows through.
func (s *Stack) Decider(p string) string {
	rel, err := cleanRel(s.fs.ws.dir, p)
	if err != nil {
		return ""
	}
	if fe, _ := s.deciding(rel); fe != nil {
		return fe.tx
	}
	return ""
}

// Layer is one transaction of the stack as a layer of the view: its own
// entries, plus the directories on the way to them (with the mode the
// view below gives them), so that it can be laid over the ones below as
// an overlayfs lower directory. ID changes whenever the content does.
type Layer struct {
	ID      string
	TxID    string
	Entries []Entry // sorted by path; KindDelete entries are whiteouts
}

// Layers returns the non-empty transactions of the stack as layers,
// bottom first. A layer is built once per content: the directories on
// the way take the modes the stack below gave them when it was built.
func (s *Stack) Layers() []Layer {
	c := &s.fs.scache
	c.mu.Lock()
	if c.key == s.key && c.last != nil {
		out := c.last
		c.mu.Unlock()
		return out
	}
	c.mu.Unlock()
	var out []Layer
	var below *fold // the fold of the first applied transactions
	applied := 0
	for i, t := range s.Txs {
		if t.Empty() {
			continue
		}
		id := fmt.Sprintf("%s-%x", t.ID, t.offset)
		c.mu.Lock()
		l, ok := c.layers[id]
		c.mu.Unlock()
		if ok {
			out = append(out, l)
			continue
		}
		if below == nil {
			below = newFold()
		}
		for ; applied < i; applied++ {
			below.apply(s.Txs[applied])
		}
		l = s.layer(t, id, below)
		c.mu.Lock()
		if c.layers == nil {
			c.layers = map[string]Layer{}
		}
		c.layers[id] = l
		c.mu.Unlock()
		out = append(out, l)
	}
	c.mu.Lock()
	if out == nil {
		out = []Layer{}
	}
	if c.key == s.key || c.key == "" {
		if c.key != s.key {
			// The fold cached (an empty stack's, whose key is "") is
			// another stack's: it must not pass for this one's.
			c.view = nil
		}
		c.key, c.last = s.key, out
	}
	keep := map[string]bool{}
	for _, l := range out {
		keep[l.ID] = true
	}
	for id := range c.layers {
		if !keep[id] {
			delete(c.layers, id)
		}
	}
	c.mu.Unlock()
	return out
}

// layer builds transaction t's layer over the fold below it.
func (s *Stack) layer(t *StackTx, id string, below *fold) Layer {
	{
		l := Layer{ID: id, TxID: t.ID}
		have := map[string]bool{}
		add := func(c change) {
			l.Entries = append(l.Entries, s.entry(&fentry{c: c, dir: t.dir}))
			have[c.Path] = true
		}
		for _, c := range t.changes {
			add(c)
		}
		for _, p := range t.whiteouts {
			add(change{Path: p, Kind: KindDelete})
		}
		var parents []string
		for _, e := range l.Entries {
			for _, a := range ancestors(e.Path) {
				if !have[a] {
					have[a] = true
					parents = append(parents, a)
				}
			}
		}
		for _, a := range parents {
			mode := uint32(0o755)
			if fe := below.m[a]; fe != nil && fe.c.Kind == KindMkdir {
				mode = fe.c.Mode
			} else if fi, err := s.fs.ws.lstat(a); err == nil && fi.IsDir() {
				mode = fsmode.ToUnix(fi.Mode())
			}
			l.Entries = append(l.Entries, s.entry(&fentry{c: change{Path: a, Kind: KindMkdir, Mode: mode}}))
		}
		sort.Slice(l.Entries, func(i, j int) bool { return l.Entries[i].Path < l.Entries[j].Path })
		return l
	}
}

// index returns the position of id in the stack, or -1.
func (s *Stack) index(id string) int {
	for i, t := range s.Txs {
		if t.ID == id {
			return i
		}
	}
	return -1
}

// overlap returns a path where a and b depend on each other: a path both
// change (unless both only make it a directory), or one beneath a path the
// other deletes or replaces by a non-directory. "" when independent.
func overlap(a, b *StackTx) string {
	type mark struct{ dirOnly, cuts bool }
	am := map[string]mark{}
	for _, c := range a.changes {
		am[c.Path] = mark{dirOnly: c.Kind == KindMkdir, cuts: c.Kind != KindMkdir}
	}
	for _, p := range a.whiteouts {
		am[p] = mark{cuts: true}
	}
	check := func(p string, dirOnly bool) string {
		if m, ok := am[p]; ok && !(m.dirOnly && dirOnly) {
			return p
		}
		for _, anc := range ancestors(p) {
			if m, ok := am[anc]; ok && m.cuts {
				return p
			}
		}
		return ""
	}
	for _, c := range b.changes {
		if hit := check(c.Path, c.Kind == KindMkdir); hit != "" {
			return hit
		}
	}
	for _, p := range b.whiteouts {
		if hit := check(p, false); hit != "" {
			return hit
		}
	}
	// What b cuts may hold what a changes beneath it.
	bm := map[string]bool{}
	for _, c := range b.changes {
		if c.Kind != KindMkdir {
			bm[c.Path] = true
		}
	}
	for _, p := range b.whiteouts {
		bm[p] = true
	}
	for p := range am {
		for _, anc := range ancestors(p) {
			if bm[anc] {
				return p
			}
		}
	}
	return ""
}

// dependents returns the transactions in others sharing a path with t,
// and one such path.
func dependents(t *StackTx, others []*StackTx) ([]string, string) {
	var ids []string
	var hit string
	for _, o := range others {
		if o.Empty() {
			continue
		}
		if p := overlap(t, o); p != "" {
			ids = append(ids, o.ID)
			if hit == "" {
				hit = p
			}
		}
	}
	return ids, hit
}

// CheckCommit refuses (a *StackError) to commit transaction id alone
// while another pending transaction changes the same paths, in any lane
// whose stack holds id: one below it would be overtaken, one above it was
// made on top of it and would no longer match the workspace. Independent
// transactions commit alone.
func (s *Stack) CheckCommit(id string) error { return s.checkSet("commit", []string{id}) }

// CheckCommit is Stack followed by Stack.CheckCommit, without reading
// the stack when there is nothing to check it against: with at most one
// pending transaction, none can depend on id. (Reading the stack reads
// every transaction's stage log; for one command's thousand writes that
// is a thousand records decoded again just to find no other.)
func (f *FS) CheckCommit(ctx context.Context, id string) error {
	unlock, _, err := f.lockGen(ctx, false)
	if err != nil {
		return err
	}
	ids, err := f.txIDs()
	unlock()
	if err != nil {
		return err
	}
	if len(ids) <= 1 {
		return nil
	}
	st, err := f.Stack(ctx)
	if err != nil {
		return err
	}
	return st.CheckCommit(id)
}

// CheckDiscard refuses (a *StackError) to discard transaction id while a
// transaction above it, in any lane whose stack holds id, changes the
// same paths (its command saw id).
func (s *Stack) CheckDiscard(id string) error { return s.checkSet("discard", []string{id}) }

// checkSet refuses to commit or discard the transactions ids together
// while, in some lane's stack, a transaction not among them depends on
// one of them: for a commit anywhere in that stack, for a discard above
// it.
func (s *Stack) checkSet(op string, ids []string) error {
	in := make(map[string]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	for _, lane := range s.lanes.all() {
		st := s.laneTxs(lane)
		for i, t := range st {
			if !in[t.ID] || t.Empty() {
				continue
			}
			cand := st
			if op == "discard" {
				cand = st[i+1:]
			}
			var others []*StackTx
			for _, o := range cand {
				if !in[o.ID] {
					others = append(others, o)
				}
			}
			if deps, p := dependents(t, others); len(deps) > 0 {
				return &StackError{Op: op, ID: t.ID, Others: deps, Path: p}
			}
		}
	}
	return nil
}

// laneTxs is lane's stack, bottom first.
func (s *Stack) laneTxs(lane string) []*StackTx {
	var out []*StackTx
	for _, t := range s.all {
		if s.lanes.sees(lane, t) {
			out = append(out, t)
		}
	}
	return out
}

// Diff renders the whole stack against the workspace as it is now, in
// the format of Tx.Diff.
func (s *Stack) Diff() (string, error) {
	v := s.fold()
	paths := make([]string, 0, len(v.m))
	for p, e := range v.m {
		if !e.hide {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	var b strings.Builder
	for _, p := range paths {
		e := v.m[p]
		if e.c.Kind == KindMkdir && e.c.Implicit {
			continue
		}
		limit := s.limit(&b)
		old, err := s.fs.oldSide(p, limit)
		if err != nil {
			return "", err
		}
		nw, err := s.side(e, limit)
		if err != nil {
			return "", err
		}
		writeFileDiff(&b, p, old, nw)
	}
	return b.String(), nil
}

// limit is how much of a file the diff holds, as Tx.Diff does: files are
// summarised once the output is large.
func (s *Stack) limit(b *strings.Builder) int64 {
	if b.Len() > diffMaxOutput {
		return 0
	}
	return DiffMaxBytes
}

func (s *Stack) side(e *fentry, limit int64) (side, error) {
	if e == nil {
		return side{}, nil
	}
	switch e.c.Kind {
	case KindWrite:
		nw, err := s.fs.stagedSide(e.dir, &e.c, limit)
		if err != nil {
			return side{}, fmt.Errorf("cowfs: diff: %w", err)
		}
		return nw, nil
	case KindSymlink:
		return side{typ: typeSymlink, data: e.c.Target, held: true, size: int64(len(e.c.Target))}, nil
	case KindMkdir:
		return side{typ: typeDir, mode: e.c.Mode}, nil
	}
	return side{}, nil
}

// sideIn returns what fold v over the workspace shows at p.
func (s *Stack) sideIn(v *fold, p string, limit int64) (side, error) {
	for _, a := range ancestors(p) {
		if fe := v.m[a]; fe != nil && fe.c.Kind != KindMkdir {
			return side{}, nil
		}
	}
	if fe := v.m[p]; fe != nil {
		return s.side(fe, limit)
	}
	return s.fs.oldSide(p, limit)
}

// TxDiff renders transaction id relative to the stack below it: what the
// command that made it changed in what it saw.
//
// A transaction of another lane is shown against that lane's stack.
func (s *Stack) TxDiff(id string) (string, error) {
	txs := s.Txs
	i := s.index(id)
	if i < 0 {
		for _, t := range s.all {
			if t.ID == id {
				txs = s.laneTxs(t.Lane)
				break
			}
		}
		for j, t := range txs {
			if t.ID == id {
				i = j
			}
		}
	}
	if i < 0 {
		return "", fmt.Errorf("%w: transaction %q is not pending", ErrNotFound, id)
	}
	below, upto := foldOf(txs[:i]), foldOf(txs[:i+1])
	t := txs[i]
	seen := map[string]bool{}
	var paths []string
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			paths = append(paths, p)
		}
	}
	cut := func(p string) {
		// What the stack below held beneath p is gone too.
		for q := range below.m {
			if strings.HasPrefix(q, p+"/") {
				add(q)
			}
		}
	}
	for _, c := range t.changes {
		if c.Kind == KindMkdir && c.Implicit {
			continue
		}
		add(c.Path)
		if c.Kind != KindMkdir {
			cut(c.Path)
		}
	}
	for _, p := range t.whiteouts {
		add(p)
		cut(p)
	}
	sort.Strings(paths)
	var b strings.Builder
	for _, p := range paths {
		limit := s.limit(&b)
		old, err := s.sideIn(below, p, limit)
		if err != nil {
			return "", err
		}
		nw, err := s.sideIn(upto, p, limit)
		if err != nil {
			return "", err
		}
		if old.typ == nw.typ && old.mode == nw.mode && (old.typ == typeDir || old.typ == "" || sidesEqual(&old, &nw)) {
			continue
		}
		writeFileDiff(&b, p, old, nw)
	}
	return b.String(), nil
}

// squashRecs turns a fold into the stage records and blobs of one
// transaction that has the same effect.
func squashRecs(v *fold) ([]stageRec, map[string]string) {
	paths := make([]string, 0, len(v.m))
	for p := range v.m {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var recs []stageRec
	blobs := map[string]string{}
	for _, p := range paths {
		e := v.m[p]
		switch {
		case e.hide:
			recs = append(recs, stageRec{Op: "whiteout", Path: p})
			continue
		case e.c.Kind == KindDelete && e.c.Before.Type == typeAbsent:
			continue
		}
		c := e.c
		if c.Kind == KindWrite {
			name := c.Blob
			if c.Pack != "" {
				name = c.Pack
			}
			blobs[name] = e.dir + "/blobs/" + name
		}
		recs = append(recs, stageRec{Op: "set", Change: &c})
	}
	return recs, blobs
}

// Squash replaces the bottom transactions of the lane's stack (up to n;
// all when n <= 0) by one with the same effect on the view and on a
// commit. The new transaction takes the place of the topmost one it
// replaces, so the transactions above stay above. Empty transactions
// (commands still running) are left in place. It returns the new
// transaction's id and the ones it replaced; nothing happens (and "" is
// returned) with fewer than two to squash.
//
// Only the lane's own transactions are squashed, and only a run that
// every other lane sees alike (all of it or none of it, never a
// transaction a fork excluded): what a lane inherited belongs to its
// parent, and a fork's view never changes because its parent squashed.
// So with forks a squash may take fewer than n, or the first such run
// higher up.
//
// The squash is durable before the originals go: a crash in between
// leaves both, and the next Stack removes the originals.
//
// While the stack has a damaged transaction (Stack.Damaged) it is refused
// as CommitAll is (ErrDamaged, nothing squashed): where a damaged
// transaction sits in the stack cannot always be read, so any run may
// hold transactions above it, and a squash of them would hide what they
// took from it. Folded into one with those below it, a path it changed
// would have the before image from below and the content from above,
// and commit without a conflict where each alone would conflict.
func (f *FS) Squash(ctx context.Context, n int) (string, []string, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	st, err := f.stackLocked()
	if err != nil {
		return "", nil, err
	}
	if err := st.refuseOverDamaged("squash", "squashed"); err != nil {
		return "", nil, err
	}
	return f.squashLocked(st.squashRun(n))
}

// refuseOverDamaged refuses (an error wrapping ErrDamaged, naming the
// first damaged transaction and saying how to resolve it) an operation
// that folds the stack's transactions together while one is damaged or
// quarantined: those above it may have been made on top of its changes,
// and folded without them they would hold what no command saw. op is the
// operation refused, done what did not happen ("committed").
func (s *Stack) refuseOverDamaged(op, done string) error {
	if len(s.Damaged) == 0 {
		return nil
	}
	d, more := s.Damaged[0], ""
	if n := len(s.Damaged) - 1; n > 0 {
		more = fmt.Sprintf(" (and %d more)", n)
	}
	return fmt.Errorf("%w: %s of the pending stack refused, nothing was %s: transaction %s%s is damaged or quarantined, and those above it may depend on its changes; inspect it (List gives the reason) and, if its changes are to go, remove %s/tx/%s by hand, then %s again: %w",
		ErrDamaged, op, done, d.ID, more, StateDir, d.ID, op, d.Err)
}

// squashRun picks the bottom run of up to n (all: n <= 0) non-empty
// transactions of the stack that may become one: the lane's own,
// adjacent but for empty ones, seen alike by every other lane, excluded
// by none. A run of one is returned only when there is no longer one.
func (s *Stack) squashRun(n int) []*StackTx {
	excluded := map[string]bool{}
	for _, r := range s.lanes.recs {
		for _, id := range r.Exclude {
			excluded[id] = true
		}
	}
	others := s.lanes.all()
	sig := func(t *StackTx) string {
		var b strings.Builder
		for _, l := range others {
			if l != s.lane && s.lanes.sees(l, t) {
				b.WriteString(l + ",")
			}
		}
		return b.String()
	}
	var best, run []*StackTx
	var runSig string
	for _, t := range s.Txs {
		if t.Empty() {
			continue
		}
		if t.Lane != s.lane || excluded[t.ID] {
			if len(run) > len(best) {
				best = run
			}
			run = nil
			continue
		}
		ts := sig(t)
		if len(run) > 0 && (ts != runSig || n > 0 && len(run) == n) {
			if len(run) >= 2 {
				return run
			}
			if len(run) > len(best) {
				best = run
			}
			run = nil
		}
		if len(run) == 0 {
			runSig = ts
		}
		run = append(run, t)
	}
	if len(run) >= 2 || len(run) > len(best) {
		return run
	}
	return best
}

// squashLocked replaces pick (bottom first, non-empty) by one transaction
// of the FS's lane.
func (f *FS) squashLocked(pick []*StackTx) (string, []string, error) {
	if len(pick) < 2 {
		if len(pick) == 1 {
			return pick[0].ID, nil, nil
		}
		return "", nil, nil
	}
	v := newFold()
	ids := make([]string, 0, len(pick))
	for _, t := range pick {
		v.apply(t)
		ids = append(ids, t.ID)
	}
	recs, blobs := squashRecs(v)
	top := pick[len(pick)-1]
	desc := fmt.Sprintf("squash of %d transactions (%s .. %s)", len(pick), pick[0].Description, top.Description)
	t := &Tx{fs: f, id: newID(), lane: f.opts.lane, desc: desc, created: top.Created, squashes: ids, changes: map[string]*change{}}
	if err := f.createTx(t, recs, blobs); err != nil {
		return "", nil, err
	}
	f.account(t.id, t.bytes, false)
	for _, id := range ids {
		if err := f.dropLocked(id); err != nil {
			return t.id, ids, err
		}
	}
	return t.id, ids, nil
}

// precheckFold compares every path the fold would change with the workspace
// now, as a commit will: it spares squashing a stack that cannot commit.
func (f *FS) precheckFold(v *fold) error {
	for p, e := range v.m {
		if e.hide || e.c.Kind == KindDelete && e.c.Before.Type == typeAbsent {
			continue
		}
		got, err := f.ws.snap(p, nil)
		if err != nil {
			return err
		}
		if e.c.Kind == KindMkdir && e.c.Implicit && got.Type == typeAbsent || dirMadeMeanwhile(&e.c, got) {
			continue
		}
		if r := compare(e.c.Before, got); r != "" {
			return conflict(p, r)
		}
	}
	return nil
}

// CommitAll commits the whole pending stack, in order, as one crash-safe
// commit: it squashes the stack into one transaction and commits that,
// so the workspace gets exactly what a command would see on top of the
// stack, all or nothing. Every path is first checked against the
// workspace (ErrConflict, nothing squashed); if the commit itself then
// meets a conflict, the squashed transaction stays pending (the
// per-command transactions are gone, their content is in it). It returns
// the paths written and the ids of the transactions committed.
//
// While the stack has a damaged transaction (Stack.Damaged) it is refused
// with an error wrapping ErrDamaged naming it, and nothing is squashed:
// the transactions above it may have been made on top of its changes, and
// committing them without it would write what no command saw.
func (f *FS) CommitAll(ctx context.Context) ([]string, []string, error) {
	return f.commitAll(ctx, nil)
}

// CommitStack is CommitAll of a stack the caller has checked: it commits
// only when the non-empty pending transactions are exactly ids, in
// order, and otherwise refuses with an error wrapping ErrStackChanged,
// nothing squashed or written. A caller that vets every change (policy,
// approval) before committing uses it so that a transaction staged
// between its check and the commit is never applied unchecked.
func (f *FS) CommitStack(ctx context.Context, ids []string) ([]string, []string, error) {
	if ids == nil {
		ids = []string{}
	}
	return f.commitAll(ctx, ids)
}

// commitAll is CommitAll; a non-nil want is CommitStack's ids.
func (f *FS) commitAll(ctx context.Context, want []string) ([]string, []string, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.stackLocked()
	if err != nil {
		unlock()
		return nil, nil, err
	}
	if err := st.refuseOverDamaged("commit", "committed"); err != nil {
		unlock()
		return nil, nil, err
	}
	var ids []string
	var pick []*StackTx
	for _, t := range st.Txs {
		if !t.Empty() {
			ids = append(ids, t.ID)
			pick = append(pick, t)
		}
	}
	if want != nil && !slices.Equal(ids, want) {
		unlock()
		return nil, nil, fmt.Errorf("%w: checked %v, now pending %v", ErrStackChanged, want, ids)
	}
	if len(ids) == 0 {
		unlock()
		return nil, nil, nil
	}
	if err := st.checkSet("commit", ids); err != nil {
		unlock()
		return nil, nil, err
	}
	if err := f.precheckFold(st.fold()); err != nil {
		unlock()
		return nil, nil, err
	}
	id, _, err := f.squashLocked(pick)
	unlock()
	if err != nil {
		return nil, nil, err
	}
	t, err := f.Tx(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	paths, err := t.Commit(ctx)
	if err != nil {
		return nil, nil, err
	}
	return paths, ids, nil
}

// DiscardAll discards every non-empty pending transaction of the lane
// (its own: what it inherited belongs to its parent) and returns their
// ids. Empty ones belong to commands still running and are left. It is
// refused (a *StackError, nothing discarded) while a transaction of
// another lane was made on top of one of them.
//
// A damaged transaction (Stack.Damaged) does not stop it and is left, as
// it was found, for inspection: what DiscardAll drops is only what the
// caller asked to drop, and nothing of it reaches the workspace, so
// those above the damaged one lose nothing that depended on it. One
// that depended on those dropped below it is no worse off: each of its
// changes keeps its before image and is refused as a conflict if it is
// ever committed over a workspace that does not match.
func (f *FS) DiscardAll(ctx context.Context) ([]string, error) {
	st, err := f.Stack(ctx)
	if err != nil {
		return nil, err
	}
	var own []string
	for _, t := range st.Txs {
		if !t.Empty() && t.Lane == f.opts.lane {
			own = append(own, t.ID)
		}
	}
	if err := st.checkSet("discard", own); err != nil {
		return nil, err
	}
	var ids []string
	for i := len(st.Txs) - 1; i >= 0; i-- {
		t := st.Txs[i]
		if t.Empty() || t.Lane != f.opts.lane {
			continue
		}
		tx, err := f.Tx(ctx, t.ID)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return ids, err
		}
		if err := tx.Discard(ctx); err != nil && !errors.Is(err, ErrClosed) {
			return ids, err
		}
		ids = append(ids, t.ID)
	}
	return ids, nil
}

// Refresh brings the transaction up to date with its stage log, which
// another process may have appended to.
func (t *Tx) Refresh(ctx context.Context) error {
	unlock, err := t.fs.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return t.refreshLocked(false)
}
