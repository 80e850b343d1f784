package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"
)

// The request channel of a warm container. Every exec the engine starts
// costs the runtime's set-up of a process in the container (runc exec),
// tens of milliseconds, most of what `docker exec true` costs; a CLI
// process, which runs one command and ends, would pay it for every
// command. So a warm container's main process is also a listener: a
// directory of the slot's (<slot>.chan, 0700, the CLI user's) is bound
// into the container at chanMount, and holds
//
//	ctl       a FIFO the main process reads request ids from
//	ID.req    the request: its kind and arguments, each ended by a NUL
//	ID.in     FIFOs for the command's stdin, stdout and stderr
//	ID.out
//	ID.err
//
// The main process is the runtime's idle step (internal/boxrt,
// idle_linux.go), which states the protocol's container side.
// The host makes ID's files, then writes "ID\n" to ctl. The main process
// claims ID by renaming ID.req to ID.run, and runs the wrapper exactly as
// an exec would run it (as root with the container's capabilities, the
// container's environment and limits), its stdio the three FIFOs; then it
// waits for the next id. The wrapper's report ends stdout as on an exec
// (exec.go). Should the claim not come (a main process that is busy,
// gone, or on another machine than this directory), the host takes the
// request back by renaming ID.req itself: exactly one of the two renames
// succeeds, so a command runs once, through the channel or, taken back,
// through an exec.
//
// Who can reach it: the directory is the CLI user's, mode 0700, so in the
// container only root (the wrapper) and that uid may enter it; the
// channel is used only when that uid is root or one no process of the
// container runs as (not the sandbox user, not a command's uid), so no
// command can write a request or read another's output. The host opens
// the files with O_NOFOLLOW: whatever is in the directory, it writes and
// reads only there.

// chanMount is where a warm container sees its slot's channel directory.
const chanMount = "/.pulse-chan"

// chanVersion is part of the warm key: a container is taken over only by
// a process that talks to its main process as it listens. chan3: the
// runtime's idle step listens, requests are NUL-separated.
const chanVersion = "chan3"

// chanClaimWait is how long the host waits for the main process to claim
// a request before it takes the request back and runs an exec instead.
// Under load the claim may come later; taking it back is then only
// slower, never wrong.
var chanClaimWait = 2 * time.Second

// chanUsable says whether this process may give its warm containers a
// channel: on Linux (a FIFO is shared with the container only through
// the same kernel), with an engine on a local socket, with the injected
// tools, and as a user whose uid no process of the container runs as.
func (b *Backend) chanUsable() bool {
	if runtime.GOOS != "linux" || b.tools == "" || !strings.HasPrefix(b.cli.DaemonHost(), "unix://") {
		return false
	}
	u := os.Geteuid()
	return u == 0 || (u != sandboxUID && u < commandGID)
}

// chanDir is the host directory of slot s's channel.
func chanDir(s *warmSlot) string { return s.path + ".chan" }

// makeChan makes s's channel directory anew, with its ctl FIFO, for a new
// container, and returns its mount.
func makeChan(s *warmSlot) (mount.Mount, error) {
	dir := chanDir(s)
	if err := os.RemoveAll(dir); err != nil {
		return mount.Mount{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return mount.Mount{}, err
	}
	if err := unix.Mkfifo(filepath.Join(dir, "ctl"), 0o600); err != nil {
		return mount.Mount{}, err
	}
	return mount.Mount{Type: mount.TypeBind, Source: dir, Target: chanMount}, nil
}

// chanRun is one command on the channel.
type chanRun struct {
	dir, id string
	opened  chan struct{} // closed when the host's ends are open (or given up)

	mu        sync.Mutex
	abandoned bool
	files     []*os.File // the host's ends: in, out, err
	holders   []*os.File // read-write ends that unblock the host's opens
}

func (c *chanRun) path(ext string) string { return filepath.Join(c.dir, c.id+"."+ext) }

// errChanRefused: the request was taken back (or never reached the main
// process); it did not run, and may run through an exec.
var errChanRefused = errors.New("docker: request channel did not take the command")

// startChan runs the wrapper with args through bx's channel. It returns
// errChanRefused when the command did not start and will not (the
// caller runs it through an exec instead).
func (b *Backend) startChan(bx *box, j *job, stdin io.Reader, args []string) (abandon func(), err error) {
	c := &chanRun{dir: bx.channel, id: args[0], opened: make(chan struct{})}
	if err := c.send("", args); err != nil {
		c.cleanup()
		return nil, err
	}
	go c.serve(j, stdin)
	return c.abandon, nil
}

// send makes c's files, with a request to run the wrapper with args (or,
// with kind "sync", the sync script), hands it to the main process and
// waits for its claim. errChanRefused: it was not claimed, and never will
// be; the caller removes c's files (cleanup) then.
func (c *chanRun) send(kind string, args []string) error {
	for _, ext := range []string{"in", "out", "err"} {
		if err := unix.Mkfifo(c.path(ext), 0o600); err != nil {
			return fmt.Errorf("%w: %v", errChanRefused, err)
		}
	}
	if kind == "" {
		kind = "exec"
	}
	var sb strings.Builder
	for _, f := range append([]string{kind}, args...) {
		if strings.IndexByte(f, 0) >= 0 {
			return fmt.Errorf("%w: an argument holds a NUL", errChanRefused)
		}
		sb.WriteString(f)
		sb.WriteByte(0)
	}
	if err := writeFileAtomic(c.path("req"), []byte(sb.String())); err != nil {
		return fmt.Errorf("%w: %v", errChanRefused, err)
	}
	// Non-blocking: no reader (no main process listening) is ENXIO at
	// once, not a wait.
	ctl, err := os.OpenFile(filepath.Join(c.dir, "ctl"), os.O_WRONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", errChanRefused, err)
	}
	_, err = ctl.Write([]byte(c.id + "\n"))
	ctl.Close()
	if err != nil {
		return fmt.Errorf("%w: %v", errChanRefused, err)
	}
	go c.open()
	select {
	case <-c.opened:
	case <-time.After(chanClaimWait):
		if os.Rename(c.path("req"), c.path("cancel")) == nil {
			c.abandon()
			<-c.opened
			return errChanRefused
		}
		// Claimed: the main process opens its ends next.
	}
	return nil
}

// maxSyncOutput bounds what is kept of the sync script's own output (its
// error messages) when it runs on the channel.
const maxSyncOutput = 64 << 10

// chanSync runs the sync script with stdin r through bx's channel, as
// execWithStdin would run it in an exec: the exec's set-up would be most
// of what a small sync costs. errChanRefused: it did not run, and will
// not; an exitError: it ended with that status; any other error: how it
// ended is not known (it may still be running).
func (b *Backend) chanSync(ctx context.Context, bx *box, id string, r io.Reader) error {
	c := &chanRun{dir: bx.channel, id: id, opened: make(chan struct{})}
	defer c.cleanup()
	if err := c.send("sync", []string{id}); err != nil {
		return err
	}
	// Claimed: the main process opens its ends at once, unless it died
	// in between, when nothing else would end the wait.
	select {
	case <-c.opened:
	case <-ctx.Done():
		c.abandon()
		<-c.opened
	case <-time.After(killGrace):
		c.abandon()
		<-c.opened
	}
	c.mu.Lock()
	files := append([]*os.File(nil), c.files...)
	ok := !c.abandoned && len(files) == 3
	c.mu.Unlock()
	if !ok {
		return errors.New("the request channel closed before the sync script's ends were open")
	}
	in, out, errf := files[0], files[1], files[2]
	go func() {
		_, _ = io.Copy(in, r)
		in.Close()
	}()
	var msg bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(&limitWriter{w: &msg, n: maxSyncOutput}, errf)
	}()
	status, err := io.ReadAll(io.LimitReader(out, 64))
	<-done
	if err != nil {
		return fmt.Errorf("reading the sync script's status: %w", err)
	}
	code, ok := parseSyncStatus(status)
	if !ok {
		return fmt.Errorf("the sync script ended without a status (%q): %s", status, strings.TrimSpace(msg.String()))
	}
	if code != 0 {
		return &exitError{code: code, out: strings.TrimSpace(msg.String())}
	}
	return nil
}

// parseSyncStatus reads the idle step's "rc N\n" line.
func parseSyncStatus(b []byte) (int, bool) {
	s, ok := strings.CutPrefix(string(b), "rc ")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "\n")
	if !ok || s == "" || strings.Trim(s, "0123456789") != "" || len(s) > 3 {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, false
	}
	return n, true
}

// limitWriter keeps the first n bytes written to it and drops the rest,
// never failing: the writer on the other end of a pipe must not block.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// open opens the host's ends of the FIFOs, in the order the main process
// opens the other ends, each waiting for its partner.
func (c *chanRun) open() {
	defer close(c.opened)
	for _, f := range []struct {
		ext  string
		flag int
	}{{"in", os.O_WRONLY}, {"out", os.O_RDONLY}, {"err", os.O_RDONLY}} {
		c.mu.Lock()
		gone := c.abandoned
		c.mu.Unlock()
		if gone {
			return
		}
		fd, err := os.OpenFile(c.path(f.ext), f.flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			c.abandon()
			return
		}
		c.mu.Lock()
		c.files = append(c.files, fd)
		gone = c.abandoned
		c.mu.Unlock()
		if gone {
			fd.Close()
			return
		}
	}
}

// serve passes stdin in and the wrapper's output on, once the ends are
// open, and finishes the job when the wrapper's output has ended.
func (c *chanRun) serve(j *job, stdin io.Reader) {
	<-c.opened
	c.mu.Lock()
	files := append([]*os.File(nil), c.files...)
	ok := !c.abandoned && len(files) == 3
	c.mu.Unlock()
	if ok {
		in, out, errf := files[0], files[1], files[2]
		go func() {
			if stdin != nil {
				_, _ = io.Copy(in, stdin)
			}
			in.Close()
		}()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(j.err, errf)
		}()
		_, _ = io.Copy(j.out, out)
		wg.Wait()
	}
	j.out.flush()
	j.err.flush()
	c.cleanup()
	j.finish()
}

// abandon stops waiting for the main process: the host's ends are
// closed, and an open still waiting for its partner gets one.
func (c *chanRun) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abandoned {
		return
	}
	c.abandoned = true
	for _, f := range c.files {
		f.Close()
	}
	// A read-write end is a reader and a writer: every open of the
	// FIFO returns at once.
	for _, ext := range []string{"in", "out", "err"} {
		if h, err := os.OpenFile(c.path(ext), os.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			c.holders = append(c.holders, h)
		}
	}
}

// cleanup closes everything and removes ID's files.
func (c *chanRun) cleanup() {
	c.mu.Lock()
	for _, f := range c.files {
		f.Close()
	}
	for _, h := range c.holders {
		h.Close()
	}
	c.files, c.holders = nil, nil
	c.mu.Unlock()
	for _, ext := range []string{"in", "out", "err", "req", "run", "cancel"} {
		_ = os.Remove(c.path(ext))
	}
}
