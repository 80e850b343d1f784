// Command pulse-namespace-init is the namespace backend's sandbox init as a
// program of its own. Installed beside pulse (or pulse-server, or any
// program built from the same source that uses the backend), it is what
// each sandbox runs as its pid 1 instead of a second start of that whole
// binary. It links the init's own code and nothing else (package
// initprog, around backend/namespace/internal/nsinit: the standard
// library and golang.org/x/sys; not the backend's side, its policy, YAML
// or HTTP packages), so its Go start-up is close to a hello world's: no
// package initialisation of the Docker client, the MCP SDK, OpenTelemetry
// or even the backend itself. The backend runs it only when it is the
// same build of that code (see namespace.InitProgramName); it does
// nothing when started by anything else.
package main

import (
	"fmt"
	"os"

	"github.com/pulse-agent/pulse/backend/namespace/initprog"
)

func main() {
	initprog.Init() // never returns in a sandbox init
	fmt.Fprintln(os.Stderr, "pulse-namespace-init: the namespace backend runs this program as a sandbox's init; it is not run by hand")
	os.Exit(2)
}
