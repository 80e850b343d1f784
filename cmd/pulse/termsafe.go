package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/pulse-agent/pulse/internal/bidi"
)

// What a person reads before committing — diffs, summaries, path lists —
// carries bytes the sandboxed command chose: file contents, file names,
// its own output. On a terminal, control sequences in them are
// instructions, not text: "\r" or ESC[1A ESC[2K erase the line a
// reviewer should have read, ESC[8m hides what follows, and bidirectional
// overrides reorder what a line shows. So review text written to a
// terminal goes through termSafe, which shows each such byte or rune as
// an escape (\x1b, \r, \u202e) instead of sending it. Written anywhere
// else (a file, a pipe, --json) the text stays byte for byte, so a diff
// still applies as a patch.

// termSafe returns s with every control byte but newline and tab, every
// C1 control, every invalid UTF-8 byte and every bidirectional formatting
// rune shown as an escape.
func termSafe(s string) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafeForTerminal(r, n) {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case !unsafeForTerminal(r, n):
			b.WriteString(s[i : i+n])
		case r == '\r':
			b.WriteString(`\r`)
		case r == utf8.RuneError || r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

func unsafeForTerminal(r rune, size int) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20 || r == 0x7f:
		return true
	case r == utf8.RuneError && size == 1: // not UTF-8: a lone byte, maybe an 8-bit C1 control
		return true
	case r >= 0x80 && r <= 0x9f: // C1 controls, CSI (U+009B) among them
		return true
	case bidi.IsControl(r): // the review page marks the same set
		return true
	}
	return false
}

// termSafeWriter applies termSafe to each Write. Its callers write whole
// strings (a line, a diff, a table flush), so a rune is never split
// across two writes; one that were would be shown as escaped bytes, not
// lost.
type termSafeWriter struct{ w io.Writer }

func (t termSafeWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(t.w, termSafe(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// forTerminal returns w itself, or — when w is a terminal — a writer that
// shows control sequences instead of sending them.
func forTerminal(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		return termSafeWriter{w}
	}
	return w
}

// resetTerminal undoes what a command's own output may have left set on
// the terminal it shares with pulse (hidden or same-colour text, a scroll
// region, a hidden cursor, origin mode, a recoloured palette, text or
// background) before pulse writes its summary there: DECSTR, a soft reset
// that clears no text, then an SGR reset for terminals without DECSTR,
// then OSC 104, 110, 111 and 112, which give the palette and the text,
// background and cursor colours back their defaults (a command's OSC 4,
// 10, 11 or 12 that --raw let through could make the summary the colour
// of the background). Terminals that know none of these ignore them, as
// they do any complete CSI or OSC sequence. Nothing is written to a
// non-terminal.
func resetTerminal(w io.Writer) {
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		io.WriteString(w, terminalReset)
	}
}

const terminalReset = "\x1b[!p\x1b[0m\x1b]104\x1b\\\x1b]110\x1b\\\x1b]111\x1b\\\x1b]112\x1b\\"
