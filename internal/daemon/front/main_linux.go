// Command front is a thin pulse front end: it hands `pulse exec` and
// `pulse cow` to the daemon of the pulse binary beside it, and executes
// that binary for everything else, or where no daemon serves.
//
// Why it exists: a command handed to the daemon costs the client little
// more than its own start, and the pulse binary's start (a Go program
// that links the Docker client, the MCP SDK, gRPC...) is 5-9 ms on this
// project's 2-core machine class, a Go program that links only this
// package's client side 2-3 ms: the difference between 1.5x and 1x a
// bwrap `true`. bench/cli.sh measures it beside the pulse binary itself
// (the BenchmarkCLIFront rows). It is not what `make build` installs as
// pulse: installed as pulse, with the full binary beside it under
// another name, it would be.
//
// The daemon is the full binary's, found beside this one as PULSE_FULL
// names it (default "pulse"): the socket name and the peer check are
// those of that executable, so that a front end and the binary itself
// share one daemon.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/internal/daemon"
)

func main() {
	full := fullBinary()
	args := os.Args[1:]
	if code, ok := handOff(full, args); ok {
		os.Exit(code)
	}
	// The full binary, under this program's name, as if run directly.
	err := syscall.Exec(full, append([]string{os.Args[0]}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "pulse: %s: %v\n", full, err)
	os.Exit(3)
}

// fullBinary is the pulse binary beside this one.
func fullBinary() string {
	name := os.Getenv("PULSE_FULL")
	if name == "" || strings.ContainsRune(name, '/') {
		name = "pulse"
	}
	self, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(self), name)
}

// handOff is cmd/pulse's viaDaemon from outside the pulse binary: the same
// commands, the same switches (PULSE_NO_DAEMON, PULSE_KEEP_WARM=0), the
// same message and exit code when the daemon is lost. Where it returns
// false, the full binary runs the command, and starts the daemon where
// none runs.
func handOff(full string, args []string) (int, bool) {
	if len(args) == 0 || (args[0] != "exec" && args[0] != "cow") {
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
	req := &daemon.Request{Args: args, Prog: prog, Dir: wd, Env: environ}
	code, err := daemon.RunFor(full, daemon.Dir(), daemon.NameFor(full, wd, environ), req,
		[3]*os.File{os.Stdin, os.Stdout, os.Stderr}, sigs)
	if err == nil {
		return code, true
	}
	if errors.Is(err, daemon.ErrLost) {
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
