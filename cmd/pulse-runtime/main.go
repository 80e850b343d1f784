// Command pulse-runtime is the in-box runtime (package
// internal/boxrt) as a program of its own: a static binary that
// the Docker backend injects into each container and runs, as root of
// the container, for the steps that tell what a command changed. It
// links the standard library and golang.org/x/sys only, and no package
// that needs cgo, so that every build of it, `go install` with cgo on
// included, runs in any image. Installed beside pulse (or any program
// that embeds the Docker backend), it is found there (see
// docs/architecture.md).
package main

import (
	"os"

	"github.com/pulse-agent/pulse/internal/boxrt"
)

func main() { os.Exit(boxrt.Main(os.Args[1:])) }
