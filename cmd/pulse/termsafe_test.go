package main

import (
	"bytes"
	"testing"
)

func TestTermSafe(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\n\tindented ünïcode ✓\n", "plain text\n\tindented ünïcode ✓\n"},
		{"+ok\n\x1b[1A\x1b[2K+evil\n", "+ok\n\\x1b[1A\\x1b[2K+evil\n"},
		{"shown\rhidden", `shown\rhidden`},
		{"\x1b[8mconcealed", `\x1b[8mconcealed`},
		{"bell\x07 del\x7f nul\x00", `bell\x07 del\x7f nul\x00`},
		{"8-bit CSI \x9b2K", `8-bit CSI \x9b2K`},           // a lone byte, not UTF-8
		{"C1 CSI \u009b2K", `C1 CSI \u009b2K`},             // the same control, UTF-8 encoded
		{"admin\u202e gnp.exe", `admin\u202e gnp.exe`},     // right-to-left override
		{"x\u2066y\u2069 \u200f", `x\u2066y\u2069 \u200f`}, // isolates, a mark
	} {
		if got := termSafe(c.in); got != c.want {
			t.Errorf("termSafe(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestForTerminalLeavesPipesAlone: written to anything but a terminal
// (a file, a pipe, a buffer) review text stays byte for byte, so that
// `pulse cow diff > x.patch` still applies.
func TestForTerminalLeavesPipesAlone(t *testing.T) {
	var b bytes.Buffer
	raw := "+a\x1b[2K\r\n"
	forTerminal(&b).Write([]byte(raw))
	resetTerminal(&b)
	if b.String() != raw {
		t.Fatalf("a non-terminal got %q, want %q", b.String(), raw)
	}
}
