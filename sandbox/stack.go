package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
)

// DefaultMaxStack is how many pending transactions a sandbox lets stack up
// before Execute squashes the older ones into one (WithMaxStack).
const DefaultMaxStack = 128

// ErrStackDependency is cowfs.ErrStackDependency: a transaction in the
// middle of the pending stack cannot be committed or discarded alone.
var ErrStackDependency = cowfs.ErrStackDependency

// WithMaxStack sets how many pending transactions may stack up before
// Execute squashes all but the newest n/4 into one (the per-command audit
// events stay; the per-command transactions become one). n < 2 is
// refused.
func WithMaxStack(n int) Option {
	return func(o *options) error {
		if n < 2 {
			return fmt.Errorf("sandbox: max stack %d must be at least 2", n)
		}
		o.maxStack = n
		return nil
	}
}

// pending reads the pending stack a command runs on: damaged transactions
// are left out and audited, a stack past the bound is squashed first.
func (s *Sandbox) pending(ctx context.Context, execID string) (*cowfs.Stack, error) {
	st, err := s.cow.Stack(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox: reading the pending stack: %w", err)
	}
	for _, d := range st.Damaged {
		s.log.Warn("a damaged pending transaction is left out of the command's view", "tx", d.ID, "err", d.Err)
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "stack", Target: d.ID, Decision: "deny",
			Reason: "damaged", Detail: "pending transaction left out of the view: " + d.Err.Error()})
	}
	bound := s.o.maxStack
	if bound == 0 {
		bound = DefaultMaxStack
	}
	n := 0
	for _, t := range st.Txs {
		if !t.Empty() {
			n++
		}
	}
	if n <= bound {
		return st, nil
	}
	id, gone, err := s.cow.Squash(ctx, n-bound/4)
	if err != nil {
		return nil, fmt.Errorf("sandbox: squashing the pending stack: %w", err)
	}
	if len(gone) == 0 {
		// Nothing could be squashed (a fork's stack that is mostly
		// inherited): run on it as it is.
		return st, nil
	}
	s.record(ctx, squashEvent(audit.Event{ExecutionID: execID, Action: "squash"}, id, gone))
	return s.pending(ctx, execID)
}

// pendingCache keeps the last stack converted for the backend: a command
// on an unchanged stack reuses it whole (a Pending is never modified once
// made).
type pendingCache struct {
	mu  sync.Mutex
	key string
	p   *backend.Pending
}

// toPendingCached is toPending, reusing the last conversion of the same
// stack.
func (s *Sandbox) toPendingCached(st *cowfs.Stack) *backend.Pending {
	c := &s.pendCache
	c.mu.Lock()
	if c.key == st.Key() && c.key != "" {
		p := c.p
		c.mu.Unlock()
		return p
	}
	c.mu.Unlock()
	p := toPending(st)
	c.mu.Lock()
	c.key, c.p = st.Key(), p
	c.mu.Unlock()
	return p
}

// toPending converts the stack for a backend.
func toPending(st *cowfs.Stack) *backend.Pending {
	layers := st.Layers()
	if len(layers) == 0 {
		return nil
	}
	p := &backend.Pending{Layers: make([]backend.PendingLayer, len(layers))}
	for i, l := range layers {
		p.Layers[i] = backend.PendingLayer{ID: l.ID, Entries: toEntries(l.Entries)}
	}
	p.View = toEntries(st.View())
	return p
}

func toEntries(in []cowfs.Entry) []backend.PendingEntry {
	out := make([]backend.PendingEntry, len(in))
	for i := range in {
		e := &in[i]
		pe := backend.PendingEntry{Path: e.Path, Mode: e.Mode, Size: e.Size, Target: e.Target, SHA: e.SHA}
		switch e.Kind {
		case cowfs.KindWrite:
			pe.Kind, pe.Open = backend.PendingFile, e.Open
		case cowfs.KindMkdir:
			pe.Kind = backend.PendingDir
		case cowfs.KindSymlink:
			pe.Kind = backend.PendingSymlink
		default:
			pe.Kind = backend.PendingDeleted
		}
		out[i] = pe
	}
	return out
}

// Stack returns the workspace's pending stack, bottom first.
func (s *Sandbox) Stack(ctx context.Context) ([]cowfs.StackTx, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	st, err := s.cow.Stack(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]cowfs.StackTx, 0, len(st.Txs))
	for _, t := range st.Txs {
		out = append(out, *t)
	}
	return out, nil
}

// PreviewStack returns the whole pending stack as one unified diff
// against the workspace; with an id, that transaction against the stack
// below it (what its command changed in what it saw).
func (s *Sandbox) PreviewStack(ctx context.Context, id string) (string, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.running.Done()
	st, err := s.cow.Stack(ctx)
	if err != nil {
		return "", err
	}
	// The workspace side of a diff may hold a configured secret.
	var d string
	if id == "" {
		d, err = st.Diff()
	} else {
		d, err = st.TxDiff(id)
	}
	return s.scrubber.Redact(d), s.scrubErr(err)
}

// CommitAll applies the whole pending stack, in order, as one crash-safe
// commit (see cowfs.FS.CommitAll). Every path is checked against the
// write and delete policy again first; a denied one refuses the whole
// commit. A change of what git runs on the host is committed only when
// the Approver approves it, as Tx.Commit has it (ErrRunsOnHost). What is
// committed is exactly the stack that was checked: a transaction staged
// meanwhile refuses the commit (cowfs.ErrStackChanged), nothing written.
// It returns the paths written.
func (s *Sandbox) CommitAll(ctx context.Context) ([]string, error) {
	paths, _, err := s.CommitStack(ctx)
	return paths, err
}

// CommitStack is CommitAll that also returns the ids of the transactions
// committed, bottom first (none when nothing was pending).
func (s *Sandbox) CommitStack(ctx context.Context) (paths, ids []string, err error) {
	if err := s.enter(); err != nil {
		return nil, nil, err
	}
	defer s.running.Done()
	st, err := s.cow.Stack(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range st.View() {
		if hit := s.entryDenied(e); hit != "" {
			s.record(ctx, audit.Event{Action: "commit", Target: hit, Decision: "deny", Detail: "commit --all: the policy denies this path"})
			return nil, nil, fmt.Errorf("%w: the pending stack changes %s", ErrPolicyDenied, s.scrubber.Redact(hit))
		}
	}
	ids = []string{}
	var hostRun []string
	for _, t := range st.Txs {
		if t.Empty() {
			continue
		}
		tx, err := s.cow.Tx(ctx, t.ID)
		if err != nil {
			return nil, nil, s.scrubErr(err)
		}
		ids = append(ids, t.ID)
		hostRun = s.hostRunPaths(tx.Changes(), hostRun)
	}
	if err := s.approvePaths(ctx, "pending stack", hostRun, "pulse cow commit --all"); err != nil {
		return nil, nil, s.scrubErr(err)
	}
	paths, ids, err = s.review().commitAll(ctx, ids)
	return s.scrubAll(paths), ids, s.scrubErr(err)
}

// entryDenied returns e's path when the policy denies what committing it
// would do.
func (s *Sandbox) entryDenied(e cowfs.Entry) string {
	a := policy.Write
	if e.Kind == cowfs.KindDelete {
		a = policy.Delete
	}
	if s.o.policy.Evaluate(a, e.Path) == policy.Deny {
		return e.Path
	}
	return ""
}

// DiscardAll drops every pending transaction of the workspace and
// returns their ids.
func (s *Sandbox) DiscardAll(ctx context.Context) ([]string, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	return s.review().DiscardAll(ctx)
}

// Squash replaces the pending stack by one transaction with the same
// effect; the per-command audit events stay. It returns the new id.
func (s *Sandbox) Squash(ctx context.Context) (string, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.running.Done()
	id, _, err := s.review().Squash(ctx)
	return id, err
}

// readPending reads rel through the pending stack. ok is false when the
// workspace shows through (the caller reads it). A pending symlink is
// followed inside the view, a few links deep.
func (s *Sandbox) readPending(ctx context.Context, rel string) (data []byte, ok bool, err error) {
	if !s.caps.CapturesWrites {
		return nil, false, nil
	}
	st, err := s.cow.Stack(ctx)
	if err != nil {
		return nil, false, err
	}
	for hops := 0; hops < 8; hops++ {
		e, decided, err := st.Lookup(rel)
		if err != nil || !decided {
			if hops > 0 && err == nil {
				// A pending link to a workspace path: read that, once
				// the policy allows it as it resolves there too (a
				// committed link may lead on to a path it denies). What
				// cannot be resolved is not read.
				t, rerr := s.resolvedReadTarget(rel)
				if rerr != nil {
					return nil, true, rerr
				}
				if t != rel {
					if _, derr := s.decide(ctx, policy.Read, t, ""); derr != nil {
						return nil, true, derr
					}
				}
				b, rerr := s.guard.ReadFile(rel)
				return b, true, rerr
			}
			return nil, false, nil
		}
		if e == nil {
			return nil, true, fmt.Errorf("%w: %s is deleted in the pending stack", fs.ErrNotExist, rel)
		}
		switch e.Kind {
		case cowfs.KindWrite:
			r, err := e.Open()
			if err != nil {
				return nil, true, err
			}
			defer r.Close()
			b, err := io.ReadAll(r)
			return b, true, err
		case cowfs.KindSymlink:
			rel = path.Join(path.Dir(rel), e.Target)
			if rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
				return nil, true, fmt.Errorf("%w: pending link %s leads outside the workspace", fs.ErrPermission, e.Path)
			}
			if _, err := s.decide(ctx, policy.Read, rel, ""); err != nil {
				return nil, true, err
			}
		default:
			return nil, true, fmt.Errorf("%s is a directory in the pending stack", rel)
		}
	}
	return nil, true, fmt.Errorf("%s: too many levels of pending symlinks", rel)
}

// concurrentChanges returns, for each path ops write or delete that
// changed under the command while it ran, what changed it: the id of the
// transaction that changed what the pending stack shows there since view
// was read (the stack the command was shown), or "" for the workspace
// itself, whose entry's inode changed after start (a commit or an edit
// the command may not have seen: its own writes never touch the
// workspace), or whose entry is gone now from a directory that changed
// after start (see removals). Either way the command made its version
// apart from that change. Directories are left out (two commands making one directory
// agree). A stack that cannot be read again reports nothing from it;
// staging goes on and meets the error itself.
func (s *Sandbox) concurrentChanges(ctx context.Context, view *cowfs.Stack, start time.Time, ops []cowfs.Op) map[string]string {
	if len(ops) == 0 {
		return nil
	}
	var out map[string]string
	add := func(p, by string) {
		if out == nil {
			out = map[string]string{}
		}
		out[p] = by
	}
	removed := &removals{s: s, start: start}
	var cur *cowfs.Stack
	if view != nil {
		if st, err := s.cow.Stack(ctx); err == nil && st.Key() != view.Key() {
			cur = st
		}
	}
	for _, op := range ops {
		if op.Kind == cowfs.KindMkdir {
			continue
		}
		full := filepath.Join(s.workspace, filepath.FromSlash(op.Path))
		if view != nil {
			was, wasDecided, err := view.Lookup(op.Path)
			if err != nil {
				continue
			}
			if wasDecided {
				// The command saw the stack's entry, not the workspace.
				if cur == nil {
					continue
				}
				now, nowDecided, err := cur.Lookup(op.Path)
				switch {
				case err != nil:
				case nowDecided:
					if !sameEntry(was, true, now, true) {
						add(op.Path, cur.Decider(op.Path))
					}
				case !workspaceHolds(full, was):
					// The transaction it saw is gone and the workspace
					// holds something else: discarded, or committed and
					// changed since.
					add(op.Path, "")
				}
				continue
			}
			if cur != nil {
				if _, nowDecided, err := cur.Lookup(op.Path); err == nil && nowDecided {
					add(op.Path, cur.Decider(op.Path))
					continue
				}
			}
		}
		// The command saw the workspace's own entry.
		if start.IsZero() {
			continue
		}
		switch present, changed := changedSince(full, start); {
		case changed:
			add(op.Path, "")
		case !present && op.Kind != cowfs.KindDelete && removed.meanwhile(ctx, op.Path, full):
			add(op.Path, "")
		}
	}
	return out
}

// removals tells whether a workspace entry that is absent now may have
// been removed while a command ran, which the entry itself, gone, cannot
// say: the command may have read it and made its version from it, and
// committing that version would bring back what was removed. Removing an
// entry changes the directory that held it, so the nearest directory
// above the path that still exists (the removed entry may have been in a
// tree removed whole) is looked at. A directory also changes when another
// entry in it is made or removed, so a command's new file can be reported
// for an unrelated change beside it: that holds its transaction for
// review, the side that loses nothing. A commit that finished while the
// command ran changes directories itself: then the path is reported when
// such a commit changed it or a directory above it, and a directory's
// change alone is not taken as a removal (nor when commits may have gone
// from the undo history already, see cowfs.FS.CommittedSince).
type removals struct {
	s     *Sandbox
	start time.Time
	dirs  map[string]bool // directory → changed after start
	read  bool            // commits and whole are read
	// commits are those that finished after start; whole, that none of
	// them is missing.
	commits []cowfs.Committed
	whole   bool
}

// meanwhile reports whether rel, at full and absent from the workspace
// now, may have been removed while the command ran.
func (r *removals) meanwhile(ctx context.Context, rel, full string) bool {
	if !r.dirChanged(full) {
		return false
	}
	if !r.read {
		r.read = true
		var err error
		if r.commits, r.whole, err = r.s.cow.CommittedSince(ctx, r.start); err != nil {
			// Unknown commits: a directory's change is not taken as a
			// removal, as with commits.
			r.s.log.Warn("reading the commits made while a command ran", "err", err)
			r.commits, r.whole = nil, false
		}
	}
	for _, c := range r.commits {
		for _, p := range c.Paths {
			if p == rel || strings.HasPrefix(rel, p+"/") {
				return true
			}
		}
	}
	return len(r.commits) == 0 && r.whole
}

// dirChanged reports whether the nearest directory above full that
// exists (up to the workspace) changed after start.
func (r *removals) dirChanged(full string) bool {
	for dir := filepath.Dir(full); len(dir) >= len(r.s.workspace); dir = filepath.Dir(dir) {
		changed, seen := r.dirs[dir]
		if !seen {
			var present bool
			present, changed = changedSince(dir, r.start)
			if !present && dir != r.s.workspace {
				continue
			}
			if r.dirs == nil {
				r.dirs = map[string]bool{}
			}
			r.dirs[dir] = changed
		}
		return changed
	}
	return false
}

// workspaceHolds reports whether the workspace entry at p is what the
// stack entry e showed (nil: absent), so that a transaction committed
// while a command ran, which moved e from the stack into the workspace,
// is no change to that command.
func workspaceHolds(p string, e *cowfs.Entry) bool {
	fi, err := os.Lstat(p)
	if e == nil || e.Kind == cowfs.KindDelete {
		return errors.Is(err, fs.ErrNotExist)
	}
	if err != nil {
		return false
	}
	switch e.Kind {
	case cowfs.KindMkdir:
		return fi.IsDir()
	case cowfs.KindSymlink:
		t, err := os.Readlink(p)
		return err == nil && fi.Mode()&fs.ModeSymlink != 0 && t == e.Target
	case cowfs.KindWrite:
		if !fi.Mode().IsRegular() || fi.Size() != e.Size || fi.Mode().Perm() != e.Mode.Perm() {
			return false
		}
		f, err := os.Open(p)
		if err != nil {
			return false
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return false
		}
		return hex.EncodeToString(h.Sum(nil)) == e.SHA
	}
	return false
}

// changedSince reports whether there is an entry at p (not followed), and
// whether its inode changed after t. The kernel stamps inode times from a
// coarse clock (a tick behind, or whole seconds on some file systems), so
// a change just after t can go unseen; none made before t is reported.
// An entry that cannot be looked at for another reason than its absence
// is taken as present and unchanged.
func changedSince(p string, t time.Time) (present, changed bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR), false
	}
	c := ctimeOf(&st)
	return true, time.Unix(c.Sec, c.Nsec).After(t)
}

// sameEntry reports whether two lookups of one path show the same thing.
func sameEntry(a *cowfs.Entry, aDecided bool, b *cowfs.Entry, bDecided bool) bool {
	switch {
	case aDecided != bDecided:
		return false
	case a == nil || b == nil:
		return a == nil && b == nil
	}
	return a.Kind == b.Kind && a.Mode == b.Mode && a.Size == b.Size && a.Target == b.Target && a.SHA == b.SHA
}
