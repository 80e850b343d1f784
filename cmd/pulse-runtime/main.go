// Command pulse-runtime is the one in-box runtime: a static program
// that every box runs. The namespace backend runs it as each sandbox's
// init (package backend/namespace/initprog, around
// backend/namespace/internal/nsinit), instead of a second start of the
// whole binary that uses the backend; the Docker backend injects it into
// each container and the gVisor backend into each runsc sandbox, where it
// runs the steps of package internal/boxrt: a command's view, the
// command, and what it changed. It links the standard library and
// golang.org/x/sys only, and no package that needs cgo, so that every
// build of it, `go install` with cgo on included, runs in any image, and
// its Go start-up is close to a hello world's. Installed beside pulse (or
// any program that embeds the backends), it is found there (see
// docs/architecture.md); each backend runs it only when it is the same
// build of its code.
package main

import (
	"os"

	"github.com/pulse-agent/pulse/backend/namespace/initprog"
	"github.com/pulse-agent/pulse/internal/boxrt"
)

func main() {
	// A namespace sandbox's init never returns from here; anything else
	// (no init's environment) goes on to the runtime's steps.
	initprog.Init()
	os.Exit(boxrt.Main(os.Args[1:]))
}
