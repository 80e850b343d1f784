package sandbox

import (
	"context"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// WatchInterval is how often Watch looks at the pending stack where the
// system cannot tell it of changes (inotify, on Linux).
const WatchInterval = 200 * time.Millisecond

// watchSafetyInterval is how often Watch looks anyway where inotify tells
// it of changes: for those inotify cannot see (a stack on a network file
// system, written from another machine). watchSettle is how long it lets
// a burst of notifications settle before it looks. Variables, for tests.
var (
	watchSafetyInterval = 2 * time.Second
	watchSettle         = 20 * time.Millisecond
	watchNoInotify      = false // poll as where inotify cannot be had
)

// FileOp is what happened to a path in the pending view.
type FileOp string

// The file operations Watch reports.
const (
	// FileCreated: the view shows the path where it did not before.
	FileCreated FileOp = "created"
	// FileChanged: the view shows other content, type or mode.
	FileChanged FileOp = "changed"
	// FileRemoved: the view deletes the path.
	FileRemoved FileOp = "removed"
	// FileSettled: the pending stack no longer decides the path, so it
	// reads as the workspace has it — its transaction was committed,
	// discarded or squashed away.
	FileSettled FileOp = "settled"
)

// FileEvent is one change Watch saw.
type FileEvent struct {
	Path string // relative to the workspace, slash-separated
	Op   FileOp
}

// Watch reports changes beneath dir ("" or "." for the whole workspace)
// as the next command would see them: each time a transaction lands on
// the pending stack — the writes of an Execute, of a Start-ed process
// when it ends, of WriteFile or a Tx, from this process or another — or
// leaves it, the paths it changes are sent on the channel, in path order.
// Edits of the workspace itself made outside the pending stack (by
// another program, or by a backend that does not capture writes, such as
// host) are reported too, for paths the stack does not decide.
//
// On Linux, inotify on the stack's directory and on the workspace's
// directories tells Watch when to look (watch_linux.go); elsewhere, or
// where inotify is not available, it looks every WatchInterval. Either
// way it compares the pending view, so a change that comes and goes
// between two looks is not reported. Workspace edits are seen only with
// inotify, and only in a workspace of at most 8192 directories (beyond
// that, none are). Paths the policy denies reading and the sandbox's own
// state are left out. The channel is closed when ctx ends or the sandbox
// closes; a reader that falls behind holds the watcher up, never loses
// events.
func (s *Sandbox) Watch(ctx context.Context, dir string) (<-chan FileEvent, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	rel, err := s.fileRel(ctx, dir, "watch")
	if err != nil {
		s.running.Done()
		return nil, s.scrubErr(err)
	}
	last, err := s.watchSnapshot(ctx, rel)
	if err != nil {
		s.running.Done()
		return nil, s.scrubErr(err)
	}
	s.record(ctx, audit.Event{Action: "read", Target: rel, Decision: "allow", Detail: "watch the pending view"})
	ch := make(chan FileEvent)
	closed := s.closing()
	n := newWatchNotifier(s.guard.Root(), rel, s.log)
	// The watcher is not counted as a running call: Close ends it.
	s.running.Done()
	// The intervals are read here, not in the goroutine, which may outlive
	// the caller's interest (and a test's change of them) by a tick.
	interval, safety := WatchInterval, watchSafetyInterval
	go func() {
		defer close(ch)
		var wake <-chan struct{}
		if n != nil {
			defer n.close()
			interval, wake = safety, n.wake
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		// Paths settled lately: the commit that settled them also wrote
		// them to the workspace, which is no change of the view.
		settled := map[string]time.Time{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-closed:
				return
			case <-t.C:
			case <-wake:
				// Let the rest of a burst (a commit, a stage log being
				// written) arrive first.
				time.Sleep(watchSettle)
				select {
				case <-wake:
				default:
				}
			}
			now, err := s.watchSnapshot(ctx, rel)
			if err != nil {
				continue // a stack being rewritten; look again
			}
			evs := diffViews(last, now, s.committedExists)
			cutoff := time.Now().Add(-safety)
			for p, at := range settled {
				if at.Before(cutoff) {
					delete(settled, p)
				}
			}
			for _, ev := range evs {
				if ev.Op == FileSettled {
					settled[ev.Path] = time.Now()
				}
			}
			if n != nil {
				evs = append(evs, s.workspaceEvents(n.take(), last, now, settled)...)
				sortEvents(evs)
			}
			for _, ev := range evs {
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				case <-closed:
					return
				}
			}
			last = now
		}
	}()
	return ch, nil
}

// workspaceEvents are the events for workspace paths changed outside the
// pending stack (changed: whether each existed before), leaving out those
// the view decides (before or now) or settled lately, those the policy
// denies reading, and a commit's temporary names.
func (s *Sandbox) workspaceEvents(changed map[string]bool, last, now map[string]viewState, settled map[string]time.Time) []FileEvent {
	var out []FileEvent
	for p, before := range changed {
		if _, ok := last[p]; ok {
			continue
		}
		if _, ok := now[p]; ok {
			continue
		}
		if _, ok := settled[p]; ok {
			continue
		}
		if strings.HasPrefix(path.Base(p), ".pulse-cow-") || pathguard.IsReserved(p) ||
			s.o.policy.Evaluate(policy.Read, p) == policy.Deny {
			continue
		}
		after := s.committedExists(p)
		switch {
		case !before && after:
			out = append(out, FileEvent{Path: p, Op: FileCreated})
		case before && !after:
			out = append(out, FileEvent{Path: p, Op: FileRemoved})
		case before && after:
			out = append(out, FileEvent{Path: p, Op: FileChanged})
		}
	}
	return out
}

// viewState is what the pending view decides about one path.
type viewState struct {
	kind   cowfs.ChangeKind
	sha    string
	mode   uint32
	target string
}

func (s *Sandbox) watchSnapshot(ctx context.Context, rel string) (map[string]viewState, error) {
	st, err := s.viewStack(ctx)
	if err != nil || st == nil {
		return map[string]viewState{}, err
	}
	out := map[string]viewState{}
	for _, e := range st.View() {
		if rel != "." && e.Path != rel && !strings.HasPrefix(e.Path, rel+"/") {
			continue
		}
		if pathguard.IsReserved(e.Path) || s.o.policy.Evaluate(policy.Read, e.Path) == policy.Deny {
			continue
		}
		out[e.Path] = viewState{kind: e.Kind, sha: e.SHA, mode: uint32(e.Mode), target: e.Target}
	}
	return out, nil
}

// committedExists reports whether the workspace has rel on disk.
func (s *Sandbox) committedExists(rel string) bool {
	root, err := os.OpenRoot(s.guard.Root())
	if err != nil {
		return false
	}
	defer root.Close()
	_, err = root.Lstat(rel)
	return err == nil
}

// diffViews lists what changed from a to b, in path order; exists says
// whether the workspace has a path the view did not decide before.
func diffViews(a, b map[string]viewState, exists func(string) bool) []FileEvent {
	var out []FileEvent
	for p, nb := range b {
		na, had := a[p]
		switch {
		case nb.kind == cowfs.KindDelete && (!had || na.kind != cowfs.KindDelete):
			out = append(out, FileEvent{Path: p, Op: FileRemoved})
		case nb.kind == cowfs.KindDelete:
		case !had && exists(p):
			out = append(out, FileEvent{Path: p, Op: FileChanged})
		case !had || na.kind == cowfs.KindDelete:
			out = append(out, FileEvent{Path: p, Op: FileCreated})
		case na != nb:
			out = append(out, FileEvent{Path: p, Op: FileChanged})
		}
	}
	for p := range a {
		if _, ok := b[p]; !ok {
			out = append(out, FileEvent{Path: p, Op: FileSettled})
		}
	}
	sortEvents(out)
	return out
}

func sortEvents(evs []FileEvent) {
	sort.Slice(evs, func(i, j int) bool { return path.Clean(evs[i].Path) < path.Clean(evs[j].Path) })
}
