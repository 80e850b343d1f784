package namespace

import (
	"io"
	"sync"

	"github.com/pulse-agent/pulse/backend"
)

// outputs caps stdout and stderr, each at limit bytes; on the first byte
// over the cap it drops the excess and calls over once. When the caller
// passed the same writer for both, writes to it are serialised, because the
// two streams are copied by two goroutines.
type outputs struct {
	stdout, stderr *capWriter
	once           sync.Once
	over           func()
	mu             sync.Mutex
	trunc          bool
	stopped        bool
}

// stop drops every later write: once Exec has returned, nothing more may
// reach the caller's writers, even from a copy that was still running.
func (o *outputs) stop() {
	o.mu.Lock()
	o.stopped = true
	o.mu.Unlock()
}

func (o *outputs) isStopped() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stopped
}

func newOutputs(stdout, stderr io.Writer, limit int64, over func()) *outputs {
	o := &outputs{over: over}
	var shared *sync.Mutex
	if stdout != nil && stdout == stderr {
		shared = new(sync.Mutex)
	}
	o.stdout = &capWriter{o: o, w: stdout, left: limit, mu: shared}
	o.stderr = &capWriter{o: o, w: stderr, left: limit, mu: shared}
	return o
}

func (o *outputs) truncated() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.trunc
}

func (o *outputs) overflow() {
	o.mu.Lock()
	o.trunc = true
	o.mu.Unlock()
	o.once.Do(o.over)
}

type capWriter struct {
	o    *outputs
	w    io.Writer
	left int64
	mu   *sync.Mutex
}

// Write always reports the whole of p as written, so that the copying
// goroutine keeps draining the pipe until the command is killed; a
// failing destination is dropped rather than blocking the command.
func (c *capWriter) Write(p []byte) (int, error) {
	n := len(p)
	keep := p
	over := false
	if int64(len(keep)) > c.left {
		keep = keep[:c.left]
		over = true
	}
	c.left -= int64(len(keep))
	if len(keep) > 0 && c.w != nil && !c.o.isStopped() {
		if c.mu != nil {
			c.mu.Lock()
		}
		if _, err := c.w.Write(keep); err != nil {
			c.w = nil
		}
		if c.mu != nil {
			c.mu.Unlock()
		}
	}
	if over {
		c.o.overflow()
	}
	return n, nil
}

// ReadFrom is what the copy of the command's pipe ends in (io.Copy
// prefers it). A writer that takes output from its source itself
// (backend.OutputReader) is handed the pipe, up to the cap and until stop;
// the rest, and everything for any other writer, is read in large chunks
// (backend.ReadOutput) instead of io.Copy's 32 KiB, each passed to Write,
// which drops what is over the cap, follows a failed write or comes after
// stop.
func (c *capWriter) ReadFrom(r io.Reader) (int64, error) {
	backend.GrowPipe(r)
	var w io.Writer
	if c.w != nil && !c.o.isStopped() {
		w = c.w
	}
	if c.mu != nil {
		// Two streams share the writer: each write must be whole.
		w = nil
	}
	read, rerr, werr, ok := backend.PassOutput(w, r, c.left, c.o.isStopped)
	if ok {
		c.left -= read
		if werr != nil {
			c.w = nil
		}
		if rerr != nil {
			return read, rerr
		}
	}
	n, err := backend.ReadOutput(c, r)
	return read + n, err
}
