package sandbox

import (
	"errors"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
)

// Watch is woken by inotify (watchNotifier) where the kernel offers it:
// on the pending stack's directories (<workspace>/.pulse/cow, each
// transaction's stage log and seal, whichever process writes them) and on
// the workspace's own directories (edits made outside Pulse, and the
// writes of a backend that does not capture them, such as host). A wake-up
// is followed by a look at the pending view as with polling, so what is
// reported is the same; only when it is looked at changes. Polling stays
// as the fallback: every WatchInterval where inotify cannot be had, and
// every watchSafetyInterval besides inotify, for changes it cannot see
// (a stack on a network file system written from another machine).

// maxWorkspaceWatches bounds the directories of the workspace watched
// with inotify; a larger tree gets no workspace events (the stack is
// still watched), rather than events for only a part of it.
var maxWorkspaceWatches = 8192

const (
	stackMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE |
		unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW
	workspaceMask = stackMask | unix.IN_DONT_FOLLOW | unix.IN_EXCL_UNLINK
)

// watchNotifier is one Watch's inotify instance.
type watchNotifier struct {
	f    *os.File // the inotify descriptor, through the runtime's poller
	fd   int
	root string // the workspace, absolute
	log  *slog.Logger
	wake chan struct{} // one pending wake-up at most

	mu      sync.Mutex
	stack   map[int32]string // watched stack directories, by watch descriptor
	ws      map[int32]string // watched workspace directories (relative; "." is the root)
	wsOff   bool             // the workspace is not watched (too large, or out of watches)
	changed map[string]bool  // workspace paths changed since the last take: whether each existed before
}

// newWatchNotifier watches the pending stack of the workspace at root
// and the workspace beneath rel. It returns nil where inotify cannot be
// had (Watch then polls).
func newWatchNotifier(root, rel string, log *slog.Logger) *watchNotifier {
	if watchNoInotify {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		log.Debug("watch: no inotify; polling the pending view", "err", err)
		return nil
	}
	n := &watchNotifier{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, root: root, log: log,
		wake: make(chan struct{}, 1), stack: map[int32]string{}, ws: map[int32]string{}, changed: map[string]bool{}}
	if err := n.addTree(filepath.Join(root, filepath.FromSlash(cowfs.StateDir)), "", true); err != nil {
		log.Debug("watch: cannot watch the pending stack; polling", "err", err)
		n.f.Close()
		return nil
	}
	n.mu.Lock()
	if err := n.addTree(filepath.Join(root, filepath.FromSlash(rel)), rel, false); err != nil {
		n.dropWorkspace(err)
	}
	n.mu.Unlock()
	go n.read()
	return n
}

// close stops the notifier; read ends.
func (n *watchNotifier) close() { n.f.Close() }

// skipStackDir: directories of the stack whose changes are not the
// stack's (blob contents are named only once a stage log refers to them).
func skipStackDir(name string) bool { return name == "blobs" || name == "trash" || name == "done" }

// addTree watches dir and the directories below it. rel is dir relative
// to the workspace (for a workspace tree); entries found in a workspace
// directory that was created after the watch began are recorded as new.
// Called with n.mu held for a workspace tree.
func (n *watchNotifier) addTree(dir, rel string, stack bool) error {
	mask := uint32(workspaceMask)
	if stack {
		mask = stackMask
	}
	wd, err := unix.InotifyAddWatch(n.fd, dir, mask)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil // gone already
		}
		return err
	}
	if stack {
		n.stack[int32(wd)] = dir
	} else {
		if len(n.ws) >= maxWorkspaceWatches {
			return errors.New("more directories than watched at most")
		}
		n.ws[int32(wd)] = rel
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // removed meanwhile: its parent's event says so
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if stack {
			if !skipStackDir(e.Name()) {
				if err := n.addTree(filepath.Join(dir, e.Name()), "", true); err != nil {
					return err
				}
			}
			continue
		}
		child := path.Join(rel, e.Name())
		if pathguard.IsReserved(child) {
			continue
		}
		if err := n.addTree(filepath.Join(dir, e.Name()), child, false); err != nil {
			return err
		}
	}
	return nil
}

// dropWorkspace stops watching the workspace. Called with n.mu held.
func (n *watchNotifier) dropWorkspace(err error) {
	if n.wsOff {
		return
	}
	n.log.Info("watch: edits to the workspace outside the pending stack are not watched", "reason", err)
	n.wsOff = true
	for wd := range n.ws {
		_, _ = unix.InotifyRmWatch(n.fd, uint32(wd))
	}
	n.ws = map[int32]string{}
	n.changed = map[string]bool{}
}

// read turns events into wake-ups until the descriptor is closed.
func (n *watchNotifier) read() {
	buf := make([]byte, 64<<10)
	for {
		k, err := n.f.Read(buf)
		if err != nil {
			return
		}
		n.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = strings.TrimRight(string(raw), "\x00")
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			n.event(ev.Wd, ev.Mask, name)
		}
		n.mu.Unlock()
		select {
		case n.wake <- struct{}{}:
		default:
		}
	}
}

// event handles one inotify event. Called with n.mu held.
func (n *watchNotifier) event(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		// Events were lost: the stack is looked at anyway; the
		// workspace's lost edits cannot be told.
		n.log.Debug("watch: inotify queue overflowed")
		return
	}
	isDir := mask&unix.IN_ISDIR != 0
	created := mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0
	if dir, ok := n.stack[wd]; ok {
		if mask&unix.IN_IGNORED != 0 {
			delete(n.stack, wd)
		} else if isDir && created && !skipStackDir(name) {
			_ = n.addTree(filepath.Join(dir, name), "", true)
		}
		return
	}
	rel, ok := n.ws[wd]
	if !ok || n.wsOff {
		return
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(n.ws, wd)
		return
	}
	if name == "" {
		return // the directory itself (its attributes); its parent reports it
	}
	p := path.Join(rel, name)
	if pathguard.IsReserved(p) {
		return
	}
	if _, seen := n.changed[p]; !seen {
		n.changed[p] = !created
	}
	if isDir && created {
		// Entries made in it before the watch began are new too.
		before := len(n.ws)
		if err := n.addTree(filepath.Join(n.root, filepath.FromSlash(p)), p, false); err != nil {
			n.dropWorkspace(err)
			return
		}
		if len(n.ws) > before {
			n.markNew(p)
		}
	}
}

// markNew records everything below the new directory p as new. Called
// with n.mu held.
func (n *watchNotifier) markNew(p string) {
	_ = filepath.WalkDir(filepath.Join(n.root, filepath.FromSlash(p)), func(full string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		r, rerr := filepath.Rel(n.root, full)
		if rerr != nil {
			return nil
		}
		r = filepath.ToSlash(r)
		if _, seen := n.changed[r]; !seen {
			n.changed[r] = false
		}
		return nil
	})
}

// take returns the workspace paths changed since the last call, each
// with whether it existed before.
func (n *watchNotifier) take() map[string]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.changed
	n.changed = map[string]bool{}
	return c
}
