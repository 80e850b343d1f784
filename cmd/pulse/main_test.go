package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLIAs(t, "pulse", args...)
}

// runCLIAs runs the command line as if pulse had been started as prog.
func runCLIAs(t *testing.T, prog string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(string) string { return "" }, prog: prog}
	code = run(context.Background(), env, args)
	return code, out.String(), errb.String()
}

func TestUnknownCommandIsUsageError(t *testing.T) {
	code, _, stderr := runCLI(t, "no-such-command")
	if code != exitUsage {
		t.Fatalf("exit code = %d, want %d", code, exitUsage)
	}
	if !strings.Contains(stderr, `unknown command "no-such-command"`) {
		t.Fatalf("stderr does not name the unknown command: %q", stderr)
	}
}

func TestNoArgumentsPrintsUsage(t *testing.T) {
	code, _, stderr := runCLI(t)
	if code != exitUsage || !strings.Contains(stderr, "usage: pulse") {
		t.Fatalf("code=%d stderr=%q", code, stderr)
	}
}
