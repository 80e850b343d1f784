package namespace

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/pulse-agent/pulse/backend"
)

var _ backend.TerminalStarter = (*Backend)(nil)

// Start implements backend.Starter: the command runs exactly as under
// Exec, in a sandbox of its own, and the handle reaches it through its
// init (pid 1 of its namespaces).
func (b *Backend) Start(ctx context.Context, req *backend.Request) (backend.Process, error) {
	if !initCalled.Load() {
		return nil, fmt.Errorf("%w: namespace: namespace.Init was not called at the top of main (or TestMain)", backend.ErrUnavailable)
	}
	return backend.Background(ctx, func(ctx context.Context, started func(backend.Control)) (*backend.Result, error) {
		return b.exec(ctx, req, func(p *initProc, nsPid int) {
			c := &control{init: p.pid(), nsPid: nsPid, newNet: p.newNet, dialer: p.dialer}
			if req.TTY != nil {
				started(&ttyControl{control: c, cfg: p.cfgW})
				return
			}
			started(c)
		})
	})
}

// StartsTerminals implements backend.TerminalStarter: the init makes the
// terminal in the sandbox's own devpts (internal/nsinit/tty_linux.go).
func (b *Backend) StartsTerminals() bool { return true }

// ttyControl is the control of a command on a terminal: resizes go to
// the init as lines on its config pipe, which it keeps reading.
type ttyControl struct {
	*control
	mu  sync.Mutex
	cfg *os.File
}

// Resize implements backend.Resizer.
func (c *ttyControl) Resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return fmt.Errorf("%w: terminal size %dx%d", backend.ErrInvalidRequest, rows, cols)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := fmt.Fprintf(c.cfg, "resize %d %d\n", rows, cols); err != nil {
		return backend.ErrProcessDone
	}
	return nil
}

// control acts on a running sandbox from the host.
type control struct {
	init   int  // host pid of the sandbox's init
	nsPid  int  // the command's pid inside the sandbox
	newNet bool // the sandbox has a network namespace of its own
	dialer *initDialer
}

// Signal sends sig to the command: its host pid is the child of the init
// whose innermost pid is nsPid. The init forwards nothing itself, so a
// signal reaches the command as it would outside.
func (c *control) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("%w: signal %v", backend.ErrUnsupported, sig)
	}
	pid, err := c.hostPid()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, s); err != nil {
		if err == syscall.ESRCH {
			return backend.ErrProcessDone
		}
		return fmt.Errorf("namespace: signal: %w", err)
	}
	return nil
}

func (c *control) hostPid() (int, error) {
	if c.nsPid <= 0 {
		return 0, backend.ErrProcessDone
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", c.init))
	if err != nil {
		return 0, backend.ErrProcessDone
	}
	for _, t := range tasks {
		kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", c.init, t.Name()))
		if err != nil {
			continue
		}
		for _, k := range strings.Fields(string(kids)) {
			pid, err := strconv.Atoi(k)
			if err == nil && innermostPid(pid) == c.nsPid {
				return pid, nil
			}
		}
	}
	return 0, backend.ErrProcessDone
}

// innermostPid is pid's number in its own pid namespace (the last NSpid
// field), or 0.
func innermostPid(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(fs[len(fs)-1])
			return n
		}
	}
	return 0
}

// DialPort connects to 127.0.0.1:port as the sandbox sees it. A sandbox
// on the host's network (allow-all) is dialled directly; one with a
// network of its own through its init, which connects from inside and
// hands the socket back (expose_linux.go; the init's side in internal/nsinit): that works for an
// unprivileged caller too, which cannot enter the namespace itself.
func (c *control) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d", backend.ErrInvalidRequest, port)
	}
	if !c.newNet {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	return c.dialer.dial(ctx, port)
}
