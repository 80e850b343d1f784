package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/sandbox"
)

// noDaemonEnv set to anything but "0" makes pulse run every command in
// its own process, never in the daemon.
const noDaemonEnv = "PULSE_NO_DAEMON"

// sandboxHold is what a daemon keeps open between the commands it runs:
// a sandbox for each workspace and set of sandbox settings (opened
// copy-on-write store, audit writer, parsed policy, selected backend and
// the box it started ahead), so that a command pays for none of them.
// A sandbox is only ever used for a request with the same key: the same
// workspace directory, flags, policy file and environment.
type sandboxHold struct {
	mu   sync.Mutex
	held map[string]*heldSandbox
	idle time.Duration
}

// holdMax bounds the sandboxes a daemon holds; the one unused longest
// is closed first.
const holdMax = 8

type heldSandbox struct {
	ready chan struct{} // closed once sb or err is set
	sb    *sandbox.Sandbox
	err   error
	refs  int
	last  time.Time
	// ws tells the workspace apart (workspaceID): the review page
	// takes any sandbox held for its workspace.
	ws string
	// retired: out of the hold, closed when its last user releases it.
	retired bool
}

func newSandboxHold(idle time.Duration) *sandboxHold {
	return &sandboxHold{held: map[string]*heldSandbox{}, idle: idle}
}

// openSandbox opens the sandbox of a command: in a daemon, the one it
// holds for key (opening it on first use); otherwise a new one, closed by
// the returned release.
func openSandbox(ctx context.Context, env *cliEnv, fs *flag.FlagSet, workspace string, opts []sandbox.Option) (*sandbox.Sandbox, func() error, error) {
	key := ""
	if env.hold != nil {
		key = holdKey(env, fs, workspace)
	}
	if key == "" {
		sb, err := sandbox.New(ctx, workspace, opts...)
		if err != nil {
			return nil, nil, err
		}
		return sb, sb.Close, nil
	}
	return env.hold.open(key, workspaceID(workspace), func() (*sandbox.Sandbox, error) {
		// The sandbox outlives this request: not cancelled with it.
		return sandbox.New(context.WithoutCancel(ctx), workspace, opts...)
	})
}

// open returns the sandbox held for key, opened with mk on first use.
// A sandbox that failed to open is not held: the next request tries
// again, as a new process would.
func (h *sandboxHold) open(key, ws string, mk func() (*sandbox.Sandbox, error)) (*sandbox.Sandbox, func() error, error) {
	h.mu.Lock()
	e := h.held[key]
	if e == nil {
		e = &heldSandbox{ready: make(chan struct{}), ws: ws}
		h.held[key] = e
		e.refs++
		h.mu.Unlock()
		e.sb, e.err = mk()
		if e.err == nil && !holdable(e.sb) {
			h.mu.Lock()
			delete(h.held, key)
			h.mu.Unlock()
			close(e.ready)
			return e.sb, e.sb.Close, nil
		}
		close(e.ready)
		if e.err != nil {
			h.mu.Lock()
			delete(h.held, key)
			h.mu.Unlock()
			return nil, nil, e.err
		}
		h.evict()
	} else {
		e.refs++
		h.mu.Unlock()
		<-e.ready
		if e.err != nil {
			return nil, nil, e.err
		}
	}
	return e.sb, h.releaser(e), nil
}

// releaser returns the release of one use of e: a retired sandbox is
// closed by the last.
func (h *sandboxHold) releaser(e *heldSandbox) func() error {
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			h.mu.Lock()
			e.refs--
			e.last = time.Now()
			closing := e.retired && e.refs == 0
			h.mu.Unlock()
			if closing {
				err = e.sb.Close()
			}
		})
		return err
	}
}

// lookup returns the sandbox held for workspace ws used last, with its
// release; nil when none is held. The review page serves any of them:
// it needs the workspace's staged state and audit writer, which the
// flags of the command that opened it do not change.
func (h *sandboxHold) lookup(ws string) (*sandbox.Sandbox, func() error) {
	if ws == "" {
		return nil, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var best *heldSandbox
	for _, e := range h.held {
		select {
		case <-e.ready:
		default:
			continue // still opening
		}
		if e.ws != ws || e.sb == nil {
			continue
		}
		if best == nil || e.last.After(best.last) {
			best = e
		}
	}
	if best == nil {
		return nil, nil
	}
	best.refs++
	return best.sb, h.releaser(best)
}

// retire takes sb out of the hold: no later request gets it, and the
// last of its users closes it. For a sandbox a session left state in
// that must not outlive it (ports it exposed).
func (h *sandboxHold) retire(sb *sandbox.Sandbox) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, e := range h.held {
		if e.sb == sb {
			delete(h.held, k)
			e.retired = true
			return
		}
	}
}

// holdable reports whether a sandbox may serve later requests. A remote
// one may not: its upload progress goes to the stderr of the request
// that opened it.
func holdable(sb *sandbox.Sandbox) bool {
	return sb.Backend().Name() != "remote"
}

// evict closes held sandboxes unused for the hold's idle time, and the
// ones unused longest beyond holdMax.
func (h *sandboxHold) evict() {
	h.mu.Lock()
	var drop []*heldSandbox
	for len(h.held) > 0 {
		var oldKey string
		var old *heldSandbox
		n := 0
		for k, e := range h.held {
			if e.refs > 0 || e.sb == nil {
				continue
			}
			n++
			if old == nil || e.last.Before(old.last) {
				oldKey, old = k, e
			}
		}
		if old == nil || (len(h.held) <= holdMax && time.Since(old.last) < h.idle) {
			break
		}
		delete(h.held, oldKey)
		drop = append(drop, old)
	}
	h.mu.Unlock()
	for _, e := range drop {
		_ = e.sb.Close()
	}
}

// close closes every sandbox held; the daemon is exiting.
func (h *sandboxHold) close() {
	h.mu.Lock()
	held := h.held
	h.held = map[string]*heldSandbox{}
	h.mu.Unlock()
	for _, e := range held {
		<-e.ready
		if e.sb != nil {
			_ = e.sb.Close()
		}
	}
}

// perCommandFlags are exec's flags that shape the command, not the
// sandbox: a held sandbox serves requests that differ in them. Any other
// flag, including one added later, is part of the key.
var perCommandFlags = []string{"timeout", "json", "raw", "env", "cwd", "session", "listen"}

// holdKey is the key of the sandbox a command needs: its workspace
// (path and inode), the sandbox flags set on its command line, the
// policy file's identity and the environment. "" when the workspace
// cannot be told apart (the command opens a sandbox of its own).
func holdKey(env *cliEnv, fs *flag.FlagSet, workspace string) string {
	abs, err := filepath.Abs(workspace)
	if err != nil {
		return ""
	}
	ws := workspaceID(abs)
	if ws == "" {
		return ""
	}
	h := sha256.New()
	fmt.Fprintf(h, "workspace %s\n", ws)
	ok := true
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(perCommandFlags, f.Name) {
			return
		}
		fmt.Fprintf(h, "flag %s=%q\n", f.Name, f.Value.String())
		if f.Name == "policy" && f.Value.String() != "" {
			ok = ok && identity(h, "policy", f.Value.String())
		}
	})
	if !ok {
		return ""
	}
	env.environ(func(kv string) { fmt.Fprintf(h, "env %q\n", kv) })
	return hex.EncodeToString(h.Sum(nil))
}

// workspaceID tells the workspace directory apart: its absolute path,
// device and inode, not its size or time, which every file made in it
// changes (a commit would otherwise leave the next request a second
// sandbox, with a second writer, of the same workspace). "" when it
// cannot be read.
func workspaceID(workspace string) string {
	abs, err := filepath.Abs(workspace)
	if err != nil {
		return ""
	}
	st, err := os.Stat(abs)
	if err != nil {
		return ""
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || !st.IsDir() {
		return ""
	}
	return fmt.Sprintf("%q %d:%d", abs, sys.Dev, sys.Ino)
}

// identity writes what tells the file at path apart (device, inode,
// size, modification time) to h; false when it cannot be read.
func identity(h interface{ Write([]byte) (int, error) }, what, path string) bool {
	st, err := os.Stat(path)
	if err != nil {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	fmt.Fprintf(h, "%s %q %d:%d %d %d\n", what, path, sys.Dev, sys.Ino, st.Size(), st.ModTime().UnixNano())
	return true
}

// environ calls fn with each entry of the command's environment, sorted,
// when it came with a daemon request.
func (env *cliEnv) environ(fn func(string)) {
	list := slices.Clone(env.env)
	slices.Sort(list)
	for _, kv := range list {
		if k, _, _ := strings.Cut(kv, "="); k == "_" || k == "OLDPWD" || k == "SHLVL" || k == noDaemonEnv {
			continue
		}
		fn(kv)
	}
}
