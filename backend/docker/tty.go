package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/pulse-agent/pulse/backend"
)

// A command with Request.TTY runs on a terminal the engine makes inside
// the container (an exec with Tty: a new pseudo-terminal of the
// container's own devpts, /dev/pts/N there), never the caller's. The
// runtime's exec step (PULSE_TTY=1) still does everything around the
// command: the copy of the workspace owned by a uid of the command's own,
// the kill of that uid's processes at the end, the report of the changes.
// Only the command itself runs elsewhere, in a second exec:
//
//  1. the exec step, in an exec without a terminal as usual, prints
//     \036PULSE-TTY-NONCE\036UID\n on stdout once the copy is made, and
//     waits for a status line on its stdin;
//  2. the host then starts the terminal exec, the runtime's tty step
//     (internal/boxrt, tty_linux.go): root only until it has entered the
//     command's directory and set the terminal's size, then, as the
//     exec step's cmd step does it (dropTo), the command's uid with no
//     capabilities and an empty bounding set, recording its pgid and
//     running the command as its child, measured as time(1) would.
//     The exec's process leads the terminal's session, so the command is
//     in its foreground group: /dev/tty is the terminal, SIGWINCH and ^C
//     reach it;
//  3. the terminal's output (stdout and stderr as one, as a terminal
//     shows them) goes to Request.Stdout, Request.Stdin is typed into it;
//     a resize is the engine's exec resize, which the kernel follows with
//     SIGWINCH;
//  4. when the terminal exec ends, the host writes its exit status to the
//     exec step, which kills what is left of the uid and reports as always.
//
// The terminal belongs to root (mode 0620, group tty) and is reached by
// the command only through the descriptors it was given, so no other
// command's uid can open it.

// ttyBeforeLaunch, when set (by a test), runs before the terminal exec is
// created: an engine slow to start it.
var ttyBeforeLaunch func(containerID, id string)

// ttyRuns are the terminals of running commands, by command id, for
// Start's Resize.
var ttyRuns sync.Map // string -> *ttyRun

// ttyRun is one command's terminal exec.
type ttyRun struct {
	b     *Backend
	id    string        // the command's
	ready chan struct{} // closed once execID is set, or the exec failed
	// execID is the terminal exec; "" when it could not be started.
	execID string
	done   chan struct{} // closed once the terminal exec has ended
}

// Resize implements backend.Resizer's half for a terminal exec.
func (r *ttyRun) resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return fmt.Errorf("docker: %w: terminal size %dx%d", backend.ErrInvalidRequest, rows, cols)
	}
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-r.ready:
	case <-r.done:
	case <-t.C:
		return fmt.Errorf("docker: resize: the terminal exec did not start: %w", backend.ErrUnavailable)
	}
	select {
	case <-r.done:
		return backend.ErrProcessDone
	default:
	}
	if r.execID == "" {
		return backend.ErrProcessDone
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := r.b.cli.ContainerExecResize(ctx, r.execID, container.ResizeOptions{Height: uint(rows), Width: uint(cols)}); err != nil {
		select {
		case <-r.done:
			return backend.ErrProcessDone
		default:
		}
		return fmt.Errorf("docker: resize: %w", err)
	}
	return nil
}

// startTTY is startFresh for a request with a terminal (see above).
func (b *Backend) startTTY(bx *box, j *job, req *backend.Request, args []string) (abandon func(), inspect func() (int, bool), err error) {
	sz := req.TTY
	if sz.Rows == 0 || sz.Cols == 0 {
		return nil, nil, fmt.Errorf("docker: terminal size %dx%d: %w", sz.Rows, sz.Cols, backend.ErrInvalidRequest)
	}
	id, dir, fsize, nonce := args[0], args[1], args[2], args[3]
	execID, hj, err := b.attachCmd(bx, append(slices.Clip(wrapperCmd), args...), true, "PULSE_TTY=1")
	if err != nil {
		return nil, nil, err
	}
	run := &ttyRun{b: b, id: id, ready: make(chan struct{}), done: make(chan struct{})}
	ttyRuns.Store(id, run)
	var (
		mu     sync.Mutex
		termHJ func()
	)
	launch := func(uid string) {
		status := 126
		if _, err := strconv.Atoi(uid); err != nil {
			close(run.ready)
			close(run.done)
		} else {
			status = b.runTerminal(bx, run, req, j, []string{
				path.Join("/work/run", uid, dir), uid, strconv.Itoa(commandGID), fsize,
				"/work/run/" + id + ".t/pgid", "/work/run/" + id + ".t/time",
				strconv.Itoa(int(sz.Rows)), strconv.Itoa(int(sz.Cols)), "/work/out/" + id + "/killed",
			}, args[4:], func(c func()) { mu.Lock(); termHJ = c; mu.Unlock() })
		}
		// The wrapper goes on: it kills what is left of the uid and
		// reports.
		_, _ = io.WriteString(hj.Conn, strconv.Itoa(status)+"\n")
		_ = hj.CloseWrite()
	}
	ctl := &ttyMarker{marker: []byte("\x1ePULSE-TTY-" + nonce + "\x1e"), w: j.out, launch: func(uid string) { go launch(uid) }}
	go func() {
		_, err := stdcopy.StdCopy(ctl, j.err, hj.Reader)
		if err != nil {
			b.log.Warn("exec output stream ended with an error", "exec", execID, "err", err)
		}
		ctl.flush()
		j.out.flush()
		j.err.flush()
		hj.Close()
		if !ctl.launched {
			close(run.ready)
			close(run.done)
		}
		<-run.done
		ttyRuns.Delete(id)
		j.finish()
	}()
	inspect = b.inspector(execID)
	abandon = func() {
		hj.Close()
		mu.Lock()
		c := termHJ
		mu.Unlock()
		if c != nil {
			c()
		}
	}
	return abandon, inspect, nil
}

// runTerminal runs the command in the terminal exec to its end and
// returns its exit status (126 when it could not be started, said on
// the command's stderr). setClose receives what abandons the exec's
// stream.
func (b *Backend) runTerminal(bx *box, run *ttyRun, req *backend.Request, j *job, pre, cmd []string, setClose func(func())) int {
	defer close(run.done)
	ctx := context.Background()
	fail := func(err error) int {
		close(run.ready)
		fmt.Fprintf(j.err.w, "pulse: docker: starting the command's terminal: %v\n", err)
		return 126
	}
	// Killed before the wrapper asked for the terminal: it is not
	// started. Killed later, while the engine creates it, the kill
	// step's mark stops it before the command (the tty step).
	select {
	case <-j.killed:
		close(run.ready)
		return 137
	default:
	}
	if ttyBeforeLaunch != nil {
		ttyBeforeLaunch(bx.id, run.id)
	}
	ec, err := b.cli.ContainerExecCreate(ctx, bx.id, container.ExecOptions{
		User:         wrapperUser,
		Tty:          true,
		AttachStdin:  req.Stdin != nil,
		AttachStdout: true,
		Env:          b.scriptEnv(),
		WorkingDir:   "/",
		Cmd:          append(append([]string{runtimePath, "tty"}, pre...), cmd...),
	})
	if err != nil {
		return fail(err)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, ec.ID, container.ExecAttachOptions{Tty: true})
	if err != nil {
		return fail(err)
	}
	setClose(hj.Close)
	run.execID = ec.ID
	close(run.ready)
	if req.Stdin != nil {
		// The end of Stdin is not passed on: a terminal has no end of
		// input, only the EOF character a program may or may not heed.
		go func() { _, _ = io.Copy(hj.Conn, req.Stdin) }()
	}
	// A terminal's stream is not multiplexed: it is what the terminal
	// shows, stdout and stderr as one.
	_, _ = io.Copy(j.out.w, hj.Reader)
	hj.Close()
	if code, err := b.execExit(ctx, ec.ID, 1000, 5*time.Millisecond); err == nil {
		return code
	}
	return 137
}

// ttyMarker is the wrapper's stdout seen first: the line
// marker UID\n asks for the terminal exec (launch); everything else,
// before (nothing, from this wrapper) and after, goes to w.
type ttyMarker struct {
	marker   []byte
	w        io.Writer
	launch   func(uid string)
	buf      []byte
	passing  bool
	launched bool
}

func (m *ttyMarker) Write(p []byte) (int, error) {
	if m.passing {
		return m.w.Write(p)
	}
	m.buf = append(m.buf, p...)
	n := min(len(m.buf), len(m.marker))
	if !bytes.Equal(m.buf[:n], m.marker[:n]) {
		m.flush()
		return len(p), nil
	}
	if len(m.buf) <= len(m.marker) {
		return len(p), nil
	}
	i := bytes.IndexByte(m.buf[len(m.marker):], '\n')
	if i < 0 {
		if len(m.buf) > len(m.marker)+16 {
			m.flush() // not the wrapper's line: the stream is passed on as it is
		}
		return len(p), nil
	}
	uid := string(m.buf[len(m.marker) : len(m.marker)+i])
	rest := m.buf[len(m.marker)+i+1:]
	m.buf, m.passing, m.launched = nil, true, true
	m.launch(uid)
	if len(rest) > 0 {
		_, _ = m.w.Write(rest)
	}
	return len(p), nil
}

// flush passes on what was held and stops looking for the marker.
func (m *ttyMarker) flush() {
	m.passing = true
	if len(m.buf) > 0 {
		_, _ = m.w.Write(m.buf)
		m.buf = nil
	}
}
