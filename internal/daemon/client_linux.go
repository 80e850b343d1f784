package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/pulse-agent/pulse/internal/daemon/client"
)

// Client errors (client's). Every one but ErrLost means the command did
// not run: the caller runs it itself.
var (
	ErrNotRunning  = client.ErrNotRunning
	ErrUnavailable = client.ErrUnavailable
	ErrRefused     = client.ErrRefused
	ErrLost        = client.ErrLost
)

// Run is client.Run: it hands req to the daemon name in dir and waits
// for the command's exit code.
func Run(dir, name string, req *Request, stdio [3]*os.File, signals <-chan os.Signal) (int, error) {
	return client.Run(dir, name, req, stdio, signals)
}

// Ask sends an OpStatus or OpStop to the daemon name in dir and returns
// its reply.
func Ask(dir, name string, req *Request) (*Reply, error) {
	c, _, err := client.Dial("/proc/self/exe", dir, name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	req.V = Version
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := c.SetTimeout(client.ReplyWait); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := c.Send(data, nil); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var buf [64 << 10]byte
	n, err := c.Read(buf[:])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var rep Reply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if rep.Refused != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, rep.Refused)
	}
	return &rep, nil
}

// Start starts this executable with args as a daemon, detached (its own
// session, stdio on /dev/null), in this process's working directory and
// environment, which make its name. It does not wait: a daemon already
// serving the name keeps it, and the new one exits.
func Start(args ...string) error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	cmd := exec.Command("/proc/self/exe", args...)
	// The environment and directory as they are: both make the name,
	// and exec.Cmd would set PWD were Env left nil.
	cmd.Env = os.Environ()
	if wd, err := os.Getwd(); err == nil {
		cmd.Dir = wd
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Not waited for: it outlives this process.
	return cmd.Process.Release()
}
