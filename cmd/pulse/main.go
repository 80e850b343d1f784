// Command pulse runs commands in a sandbox and reviews what they wrote.
//
// Each subcommand lives in its own file and registers itself in init, so
// that the packages it drives stay independent of each other.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/pulse-agent/pulse/backend/namespace"
)

// Exit codes shared by every subcommand.
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(env.stderr, "pulse: unknown command %q\n\n", args[0])
		usage(env.stderr)
		return exitUsage
	}
	return c.run(ctx, env, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: pulse COMMAND [ARGS...]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}
