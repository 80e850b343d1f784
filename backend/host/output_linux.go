package host

import (
	"io"

	"github.com/pulse-agent/pulse/backend"
)

// ReadFrom is what os/exec's copy of the command's pipe ends in (io.Copy
// prefers it). A writer that takes output from its source itself
// (backend.OutputReader) is handed the pipe, up to the cap; the rest, and
// everything for any other writer, is read in large chunks
// (backend.ReadOutput) instead of io.Copy's 32 KiB, each passed to Write,
// which drops what is over the cap or follows a failed write.
func (c *capWriter) ReadFrom(r io.Reader) (int64, error) {
	backend.GrowPipe(r)
	c.mu.Lock()
	w, left := c.w, c.left
	if c.werr != nil {
		w = nil
	}
	c.mu.Unlock()
	read, rerr, werr, ok := backend.PassOutput(w, r, left, nil)
	if ok {
		c.mu.Lock()
		c.left -= read
		if werr != nil && c.werr == nil {
			c.werr = werr
		}
		c.mu.Unlock()
		if rerr != nil {
			return read, rerr
		}
	}
	n, err := backend.ReadOutput(c, r)
	return read + n, err
}
