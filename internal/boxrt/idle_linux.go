package boxrt

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A warm container's main process (the idle step): it keeps the
// container up while it is used and ends it once no other process has run
// in it for IDLE seconds, looking every POLL seconds. Processes are
// counted by their /proc entries: a warm container has no other way to
// tell that an exec of the backend's is running in it.
//
// With a channel (CHANDIR UID GID), it is also the listener of the
// container's request channel (backend/docker, channel.go): a directory
// bound into the container, only root's and the CLI user's, holding
//
//	ctl       a FIFO the host writes request ids to, one a line
//	ID.req    the request: its kind ("exec" or "sync") and arguments,
//	          each ended by a NUL
//	ID.in     FIFOs for the request's stdin, stdout and stderr
//	ID.out
//	ID.err
//
// A request is claimed by renaming ID.req to ID.run; the host takes back
// an unclaimed one by renaming it away, and exactly one rename succeeds,
// so a command runs once, here or through an exec of its own. An exec
// request runs the exec step as an exec would (as root with the
// container's capabilities and environment), its stdio the FIFOs; a sync
// request runs the sync step as UID:GID with no capabilities (the
// setuid drops them), its output on the err FIFO and its exit status
// alone on out, as "rc N\n". Requests run one at a time, in the order
// their ids come.

// maxRequest bounds a request file; the host writes a few hundred bytes.
const maxRequest = 1 << 20

// runIdle is the idle step: idle IDLE POLL [CHANDIR UID GID].
func runIdle(a []string) int {
	if len(a) != 2 && len(a) != 5 {
		return usage()
	}
	idle, err1 := strconv.Atoi(a[0])
	poll, err2 := strconv.Atoi(a[1])
	if err1 != nil || err2 != nil || idle < 0 || poll <= 0 {
		return usage()
	}
	var ch *channel
	var ids <-chan string
	if len(a) == 5 {
		uid, err1 := strconv.ParseUint(a[3], 10, 32)
		gid, err2 := strconv.ParseUint(a[4], 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			return usage()
		}
		self, err := os.Executable()
		if err != nil {
			self = toolsDir + "/" + Name
		}
		ch = &channel{dir: a[2], self: self, uid: uint32(uid), gid: uint32(gid)}
		// Read-write, so that the FIFO never reads an end of file when
		// the host's writer closes: the next request finds it open.
		ctl, err := os.OpenFile(filepath.Join(ch.dir, "ctl"), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s idle: the request channel: %v\n", Name, err)
			return 1
		}
		defer ctl.Close()
		ids = readIDs(ctl)
	}
	for i := 0; i < idle; {
		select {
		case id, ok := <-ids:
			if !ok {
				// The channel broke: the host takes every request back
				// after its claim wait and runs it through an exec.
				ids = nil
				continue
			}
			i = 0
			ch.serve(id)
			continue
		case <-time.After(time.Duration(poll) * time.Second):
		}
		if othersRun() {
			i = 0
		} else {
			i += poll
		}
	}
	return 0
}

// readIDs sends the well-formed ids of the lines read from r, and closes
// the channel when r fails.
func readIDs(r io.Reader) <-chan string {
	ids := make(chan string)
	go func() {
		defer close(ids)
		s := bufio.NewScanner(r)
		for s.Scan() {
			if id := s.Text(); validID(id) {
				ids <- id
			}
		}
	}()
	return ids
}

// validID: a request id is lower-case hex, nothing else (it names files).
func validID(id string) bool {
	return id != "" && len(id) <= 64 && strings.Trim(id, "0123456789abcdef") == ""
}

// othersRun is whether a process other than the container's init (pid 1)
// and this one has a /proc entry (threads have none of their own there).
func othersRun() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true // unknown: stay up
	}
	self := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		n := e.Name()
		if n == "1" || n == self || strings.Trim(n, "0123456789") != "" {
			continue
		}
		return true
	}
	return false
}

// channel is the request channel of the idle step.
type channel struct {
	dir      string
	self     string // this program, for the exec and sync steps
	uid, gid uint32 // the sync step's
}

func (c *channel) path(id, ext string) string { return filepath.Join(c.dir, id+"."+ext) }

// serve claims and runs request id, if the host has not taken it back.
func (c *channel) serve(id string) {
	run := c.path(id, "run")
	if os.Rename(c.path(id, "req"), run) != nil {
		return
	}
	// The FIFOs in the order the host opens its ends: each open waits
	// for its partner.
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, f := range []struct {
		ext  string
		flag int
	}{{"in", os.O_RDONLY}, {"out", os.O_WRONLY}, {"err", os.O_WRONLY}} {
		fd, err := os.OpenFile(c.path(id, f.ext), f.flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		files = append(files, fd)
	}
	in, out, errf := files[0], files[1], files[2]
	kind, args, err := readRequest(run)
	if err != nil {
		fmt.Fprintf(errf, "%s idle: request %s: %v\n", Name, id, err)
		return
	}
	switch kind {
	case "exec":
		// The exec step's report ends its stdout, as on an exec of its
		// own; how it ended is in that report.
		cmd := exec.Command(c.self, append([]string{"exec"}, args...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, errf
		_ = cmd.Run()
	case "sync":
		cmd := exec.Command(c.self, append([]string{"sync"}, args...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = in, errf, errf
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.uid, Gid: c.gid}}
		fmt.Fprintf(out, "rc %d\n", exitStatus(cmd.Run()))
	}
}

// errRequest: a request file that does not say what to run.
var errRequest = errors.New("malformed request")

// readRequest reads a request file: its kind and arguments, each ended
// by a NUL.
func readRequest(path string) (kind string, args []string, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRequest+1))
	if err != nil {
		return "", nil, err
	}
	kind, args, err = parseRequest(b)
	return kind, args, err
}

// parseRequest splits a request into its kind and arguments. A request
// of an unknown kind, or not ended by a NUL, or over maxRequest, runs
// nothing.
func parseRequest(b []byte) (kind string, args []string, err error) {
	if len(b) > maxRequest {
		return "", nil, fmt.Errorf("%w: over %d bytes", errRequest, maxRequest)
	}
	s, ok := strings.CutSuffix(string(b), "\x00")
	if !ok {
		return "", nil, fmt.Errorf("%w: not ended by a NUL", errRequest)
	}
	f := strings.Split(s, "\x00")
	kind, args = f[0], f[1:]
	if kind != "exec" && kind != "sync" {
		return "", nil, fmt.Errorf("%w: kind %q", errRequest, kind)
	}
	if kind == "exec" && len(args) == 0 {
		return kind, nil, fmt.Errorf("%w: exec without arguments", errRequest)
	}
	return kind, args, nil
}

// exitStatus is a shell's $? for how a command ended: its status, 128+N
// for signal N, 127 when it did not start.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 127
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}
