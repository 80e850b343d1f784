package host

import (
	"io"

	"github.com/pulse-agent/pulse/backend"
)

// ReadFrom is what os/exec's copy of the command's pipe ends in (io.Copy
// prefers it): the pipe is read in large chunks (backend.ReadOutput)
// instead of io.Copy's 32 KiB, each passed to Write.
func (c *capWriter) ReadFrom(r io.Reader) (int64, error) { return backend.ReadOutput(c, r) }
