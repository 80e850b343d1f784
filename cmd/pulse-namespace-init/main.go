// Command pulse-namespace-init is the namespace backend's sandbox init as a
// program of its own. Installed beside pulse (or pulse-server, or any
// program built from the same source that uses the backend), it is what
// each sandbox runs as its pid 1 instead of a second start of that whole
// binary: it links the backend and nothing else, so its Go start-up pays
// no package initialisation of the Docker client, the MCP SDK or
// OpenTelemetry. The backend runs it only when it is the same build (see
// namespace.InitProgramName); it does nothing when started by anything
// else.
package main

import (
	"fmt"
	"os"

	"github.com/pulse-agent/pulse/backend/namespace"
)

func main() {
	namespace.Init() // never returns in a sandbox init
	fmt.Fprintln(os.Stderr, "pulse-namespace-init: the namespace backend runs this program as a sandbox's init; it is not run by hand")
	os.Exit(2)
}
