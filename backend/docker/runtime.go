package docker

import (
	"errors"

	"github.com/pulse-agent/pulse/internal/boxrt"
)

// The in-box runtime (package internal/boxrt, the program
// cmd/pulse-runtime) tells, inside the container, what each command
// changed and keeps the container's manifests of its base and copies. It
// is a static program (no cgo in anything it links, so every build of it
// is), injected with the tools at runtimePath, root's and read-only, and
// run by the wrapper and the sync script for those steps.
//
// Where it comes from, and what makes it trusted, is backend/internal/
// rtprog's (shared with the gVisor backend). Without one, containers
// cannot be made and Exec fails with backend.ErrUnavailable, naming what
// to install.

// runtimePath is where the runtime program is in the container.
const runtimePath = toolsDir + "/" + boxrt.Name

// WithRuntime sets the in-box runtime program (cmd/pulse-runtime, built
// from the same source as this binary) that is injected into every
// container; by default it is looked for beside the running binary.
func WithRuntime(path string) Option {
	return func(o *options) error {
		if path == "" {
			return errors.New("docker: WithRuntime: empty path")
		}
		o.runtime = path
		return nil
	}
}
