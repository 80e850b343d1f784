// The Linux front end: client.Commands go to the daemon (doc.go says why).

package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/internal/daemon/client"
)

func main() {
	full := fullBinary()
	args := os.Args[1:]
	if code, ok := handOff(full, args); ok {
		os.Exit(code)
	}
	os.Exit(execFull(full, args))
}

// handOff is cmd/pulse's viaDaemon from outside the pulse binary: the same
// commands, the same switches (PULSE_NO_DAEMON, PULSE_KEEP_WARM=0), the
// same message and exit code when the daemon is lost. Where it returns
// false, the full binary runs the command, and starts the daemon where
// none runs.
func handOff(full string, args []string) (int, bool) {
	if len(args) == 0 || !slices.Contains(client.Commands, args[0]) {
		return 0, false
	}
	if v := os.Getenv("PULSE_NO_DAEMON"); v != "" && v != "0" {
		return 0, false
	}
	keep := os.Getenv("PULSE_KEEP_WARM")
	if keep == "" {
		keep = os.Getenv("PULSE_DOCKER_IDLE")
	}
	if keep == "0" {
		return 0, false
	}
	wd, err := os.Getwd()
	if err != nil {
		return 0, false
	}
	environ := os.Environ()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	prog := "pulse"
	if strings.ContainsRune(os.Args[0], '/') {
		prog = os.Args[0]
	}
	req := &client.Request{Args: args, Prog: prog, Dir: wd, Env: environ}
	code, err := client.RunFor(full, client.Dir(), client.NameFor(full, wd, environ), req,
		[3]*os.File{os.Stdin, os.Stdout, os.Stderr}, sigs)
	if err == nil {
		return code, true
	}
	if errors.Is(err, client.ErrLost) {
		fmt.Fprintf(os.Stderr, "pulse: %v: the command may have run in part and was not run again; "+
			"what it wrote is staged only if it got that far (pulse cow list shows the pending transactions)\n", err)
		if code == 0 {
			code = 125
		}
		return code, true
	}
	signal.Stop(sigs)
	select {
	case s := <-sigs:
		return 128 + int(s.(syscall.Signal)), true
	default:
	}
	return 0, false
}
