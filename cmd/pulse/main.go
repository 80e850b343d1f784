// Command pulse runs commands in a sandbox and reviews what they wrote.
//
// Each subcommand lives in its own file and registers itself in init, so
// that the packages it drives stay independent of each other. What every
// command shares — the usage format, --help, exit codes, the JSON error
// object of --json — lives in cli.go.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	// Every backend is offered to selection (sandbox.New): remote,
	// Docker, namespaces and the opt-in host.
	_ "github.com/pulse-agent/pulse/backend/all"
	"github.com/pulse-agent/pulse/backend/namespace"

	// A pulse process is short: its heap in huge pages saves a few
	// hundred page faults at every start (internal/hugeheap says why).
	_ "github.com/pulse-agent/pulse/internal/hugeheap"
)

// Exit codes shared by every subcommand (see exitCodesHelp).
const (
	exitOK       = 0
	exitFailure  = 1 // the operation failed, or found a conflict or tampering
	exitUsage    = 2 // the command line was wrong
	exitInternal = 3 // an unexpected error
)

// command is one `pulse NAME ...` subcommand.
type command struct {
	name    string
	summary string
	// usage is the synopsis, one line per form, each starting "pulse NAME".
	usage []string
	// help is the longer description `pulse help NAME` prints.
	help string
	// subcommands are the words that may follow NAME (cow list, ...), each
	// answering --help; nil for a command without any.
	subcommands []string
	// run gets the arguments after the subcommand name and returns the
	// process exit code.
	run func(ctx context.Context, env *cliEnv, args []string) int
}

// cliEnv is what a subcommand may touch, so tests can run it in-process.
type cliEnv struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// prog is how the user started pulse ("pulse", or "go run ./cmd/pulse"),
	// for the hints that tell them what to run next.
	prog string
	// hold is the daemon's sandboxes (daemon.go) when the command runs
	// in the daemon, and env the environment its request came with;
	// nil in a pulse process of its own.
	hold *sandboxHold
	env  []string
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("pulse: subcommand registered twice: " + c.name)
	}
	commands[c.name] = c
}

func main() {
	// The namespace backend re-runs this binary as the sandbox init; in
	// that child Init never returns.
	namespace.Init()
	// exec and cow go to the user's daemon where one can serve them
	// (daemon_linux.go), before anything else is set up.
	if code, ok := viaDaemon(os.Args[1:]); ok {
		os.Exit(code)
	}
	ctx, sig := notifySignals(context.Background())
	env := &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, prog: progName(os.Args[0])}
	code := run(ctx, env, os.Args[1:])
	if n := sig.Load(); n != 0 {
		// A command ended by a signal exits 128+N, as a shell reports it.
		code = 128 + int(n)
	}
	os.Exit(code)
}

// notifySignals returns a context cancelled on the first SIGINT or
// SIGTERM, and the number of that signal once it came. A second signal
// exits at once, for a command that does not stop.
func notifySignals(parent context.Context) (context.Context, *atomic.Int32) {
	ctx, cancel := context.WithCancel(parent)
	var got atomic.Int32
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-ch
		n := int32(s.(syscall.Signal))
		got.Store(n)
		cancel()
		<-ch
		os.Exit(128 + int(n))
	}()
	return ctx, &got
}
