package main

// docs/cli.md holds every command's help; this rewrites it (make docs
// rewrites it with pulse-server's and pulse-worker's).
//go:generate env PULSE_UPDATE_DOCS=1 go test -count=1 -run ^TestCLIReferenceIsCurrent$ .

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// exitCodesHelp is the exit code table, printed by `pulse help` and so in
// docs/cli.md's generated reference (make docs).
const exitCodesHelp = `exit codes:
  0        success
  1        the operation failed (a conflict, a tampered log, an error it reports)
  2        the command line was wrong (unknown command, bad flag, missing argument)
  3        an unexpected internal error
  124      exec: the command timed out
  125      exec, mcp: the sandbox could not run it (no backend, refused by policy),
           or exec: it ran but what it wrote could not be staged (the error says why)
  128+N    pulse was ended by signal N (130 for Ctrl-C, 143 for SIGTERM)
  other    exec: the command's own exit code`

const jsonHelp = `--json: the command prints one JSON object (or array) on stdout; on failure it
prints {"error": "...", "exit_code": N} there instead. Durations are in
milliseconds, in fields named *_ms.`

func run(ctx context.Context, env *cliEnv, args []string) int {
	if env.prog == "" {
		env.prog = "pulse"
	}
	if len(args) == 0 {
		usage(env.stderr, env.prog)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(env.stdout, env.prog)
		return exitOK
	case "help":
		return runHelp(ctx, env, args[1:])
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(env.stderr, "pulse: unknown command %q\n\n", args[0])
		usage(env.stderr, env.prog)
		return exitUsage
	}
	if !wantsJSON(args[1:]) {
		return c.run(ctx, env, args[1:])
	}
	// With --json a failure is a JSON object on stdout, whichever way the
	// command failed: the message it printed on stderr is kept for it.
	out := &countingWriter{w: env.stdout}
	msg := &firstError{w: env.stderr}
	jenv := *env
	jenv.stdout, jenv.stderr = out, msg
	code := c.run(ctx, &jenv, args[1:])
	if code != exitOK && out.n == 0 {
		e := msg.message()
		if e == "" {
			e = fmt.Sprintf("pulse %s failed", c.name)
		}
		writeJSON(env.stdout, map[string]any{"error": e, "exit_code": code})
	}
	return code
}

// wantsJSON reports whether --json is among a command's flags (before a
// "--" that ends them).
func wantsJSON(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-json", "--json", "-json=true", "--json=true":
			return true
		}
	}
	return false
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// firstError passes stderr through and keeps its first line that is not
// a warning or a usage text: the command's error message.
type firstError struct {
	w    io.Writer
	buf  bytes.Buffer
	line string
}

func (f *firstError) Write(p []byte) (int, error) {
	if f.line == "" && f.buf.Len() < 64<<10 {
		f.buf.Write(p)
		for f.line == "" {
			l, err := f.buf.ReadString('\n')
			if err != nil {
				f.buf.Reset()
				f.buf.WriteString(l)
				break
			}
			l = strings.TrimSpace(l)
			low := strings.ToLower(l)
			if l != "" && !strings.Contains(low, "warning") && !strings.HasPrefix(low, "usage:") {
				f.line = l
			}
		}
	}
	return f.w.Write(p)
}

func (f *firstError) message() string {
	if f.line == "" {
		return strings.TrimSpace(f.buf.String())
	}
	return f.line
}

func usage(w io.Writer, prog string) {
	fmt.Fprintf(w, "usage: %s COMMAND [ARGS...]\n", prog)
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands)+1)
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-8s %s\n", "help", "show a command's usage, flags and exit codes (help COMMAND)")
	fmt.Fprintf(w, "\nRun '%s help COMMAND' or '%s COMMAND --help' for a command's flags.\n\n%s\n\n%s\n", prog, prog, jsonHelp, exitCodesHelp)
}

// runHelp implements `pulse help [COMMAND [SUBCOMMAND]]`.
func runHelp(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 {
		usage(env.stdout, env.prog)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(env.stderr, "pulse help: unknown command %q\n", args[0])
		return exitUsage
	}
	// Every command answers --help itself, with its flags.
	return c.run(ctx, env, append(append([]string(nil), args[1:]...), "--help"))
}

// newFlagSet returns the flag set of `pulse NAME` (name may be "cow diff"),
// printing the command's help in the one usage format.
func newFlagSet(env *cliEnv, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("pulse "+name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	top, _, _ := strings.Cut(name, " ")
	fs.Usage = func() { printHelp(fs.Output(), env.prog, commands[top], name, fs) }
	return fs
}

// printHelp prints a command's help: usage lines, description, flags.
// name may be a subcommand ("cow diff"); only its own usage lines show.
func printHelp(w io.Writer, prog string, c command, name string, fs *flag.FlagSet) {
	lines := c.usage
	if len(lines) == 0 {
		lines = []string{"pulse " + c.name + " [flags]"}
	}
	first := true
	for _, l := range lines {
		if name != c.name && !strings.HasPrefix(l, "pulse "+name) {
			continue
		}
		prefix := "       "
		if first {
			prefix, first = "usage: ", false
		}
		fmt.Fprintf(w, "%s%s%s\n", prefix, prog, strings.TrimPrefix(l, "pulse"))
	}
	if c.summary != "" && name == c.name {
		fmt.Fprintf(w, "\n%s\n", c.summary)
	}
	if c.help != "" && name == c.name {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	if fs != nil {
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
}

// parseFlags parses args into fs. done is true when the caller should
// return code at once: after --help (help on stdout, exit 0) or a bad flag
// (the error and usage on stderr, exit 2).
func parseFlags(env *cliEnv, fs *flag.FlagSet, args []string) (code int, done bool) {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(env.stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		io.Copy(env.stdout, &buf)
		return exitOK, true
	case err != nil:
		fmt.Fprintf(env.stderr, "%s: %v\n", fs.Name(), err)
		printUsageLines(env, fs)
		return exitUsage, true
	}
	return exitOK, false
}

// parseNoArgs is parseFlags for a command that takes no positional
// arguments: one is a usage error.
func parseNoArgs(env *cliEnv, fs *flag.FlagSet, args []string) (code int, done bool) {
	if code, done := parseFlags(env, fs, args); done {
		return code, true
	}
	if fs.NArg() != 0 {
		return usageError(env, fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0))), true
	}
	return exitOK, false
}

// parseInterleaved parses flags that may come before or after positional
// arguments, returning the positional ones.
func parseInterleaved(env *cliEnv, fs *flag.FlagSet, args []string) (pos []string, code int, done bool) {
	rest := args
	for {
		if code, done := parseFlags(env, fs, rest); done {
			return nil, code, true
		}
		if fs.NArg() == 0 {
			return pos, exitOK, false
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}

// usageError reports a wrong command line: the problem, the usage lines
// and where to find more, on stderr; exit 2.
func usageError(env *cliEnv, fs *flag.FlagSet, problem string) int {
	fmt.Fprintf(env.stderr, "%s: %s\n", fs.Name(), problem)
	printUsageLines(env, fs)
	return exitUsage
}

func printUsageLines(env *cliEnv, fs *flag.FlagSet) {
	name := strings.TrimPrefix(fs.Name(), "pulse ")
	top, _, _ := strings.Cut(name, " ")
	printHelp(env.stderr, env.prog, command{name: top, usage: commands[top].usage}, name, nil)
	fmt.Fprintf(env.stderr, "Run '%s help %s' for the flags.\n", env.prog, name)
}

// isHelp reports whether arg asks for help, for commands that look at
// their first argument (a subcommand) before any flag set parses it.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// commandHelp prints the help of a command with subcommands and exits 0.
func commandHelp(env *cliEnv, name string) int {
	printHelp(env.stdout, env.prog, commands[name], name, nil)
	fmt.Fprintf(env.stdout, "\nRun '%s %s SUBCOMMAND --help' for a subcommand's flags.\n", env.prog, name)
	return exitOK
}

// progName is how the user started pulse, for hints they can paste: the
// path they typed, or `go run ./cmd/pulse` when the binary is one that
// `go run` built in a temporary directory.
func progName(arg0 string) string {
	if strings.Contains(filepath.ToSlash(arg0), "/go-build") && filepath.Base(filepath.Dir(arg0)) == "exe" {
		if fi, err := os.Stat(filepath.Join("cmd", "pulse")); err == nil && fi.IsDir() {
			return "go run ./cmd/pulse"
		}
		return "go run github.com/pulse-agent/pulse/cmd/pulse"
	}
	if strings.ContainsRune(arg0, '/') {
		return arg0
	}
	return "pulse"
}
