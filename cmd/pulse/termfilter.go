package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// A command's output shown live on the user's terminal is a stream of
// bytes the command chose. Most of what a terminal does with it stays on
// the screen: text, colours, cursor moves, erasing. Some sequences act
// outside it: OSC 52 writes the clipboard, OSC 0/2 the window title, OSC
// 8 makes links, OSC 4/10/11 recolour the palette (same colour for text
// and background hides whatever follows, pulse's own summary among it),
// DCS/APC/PM/SOS carry terminal- and multiplexer-specific commands
// (tmux passthrough, graphics, DECRQSS), and queries such as CSI 6n, CSI
// c or CSI 21t make the terminal type an answer into the shell that runs
// after pulse. termFilter passes the first kind and holds the second
// back, on terminals only: a pipe or a file gets the bytes unchanged.
//
// The filter never sends part of a sequence: what reaches the terminal is
// text and complete sequences it allows, so the terminal's own parser is
// back in its ground state after each, whatever the command sends next
// and however its output is cut into writes. A sequence or a UTF-8
// character split across two writes is held until it is complete.

// termState is where the filter is in the command's stream.
type termState uint8

const (
	stGround    termState = iota
	stEsc                 // after ESC
	stEscInter            // ESC and intermediates (nF): dropped at its final byte
	stCSI                 // collecting a control sequence
	stString              // inside OSC, DCS, SOS, PM or APC: dropped to its end
	stStringEsc           // ESC inside a string: ST, or the start of a new sequence
)

// maxCSI is the longest control sequence the filter collects; a longer one
// is no colour or cursor move any program sends, and is dropped.
const maxCSI = 256

// termFilter is an io.Writer that passes a command's output to a terminal
// with the sequences that act outside the screen removed. Close ends the
// stream: what is left of an unfinished sequence is dropped.
type termFilter struct {
	mu    sync.Mutex
	w     io.Writer
	state termState
	seq   []byte // the CSI being collected, from its ESC [
	bad   bool   // the CSI being collected is malformed or too long
	kind  string // the string being dropped: "OSC", "DCS", ...
	osc   []byte // an OSC's number, as far as it came
	oscOn bool   // the OSC's number is still being read
	pend  []byte // an incomplete UTF-8 character at the end of the last write
	out   []byte
	held  map[string]int
}

func newTermFilter(w io.Writer) *termFilter {
	return &termFilter{w: w, held: map[string]int{}}
}

// commandOutput is what a command's output stream is written to: w
// itself when w is not a terminal or raw is set, else a termFilter.
func commandOutput(w io.Writer, raw bool) (io.Writer, *termFilter) {
	if f, ok := w.(*os.File); ok && !raw && isTerminal(f) {
		t := newTermFilter(w)
		return t, t
	}
	return w, nil
}

func (t *termFilter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := p
	if len(t.pend) > 0 {
		in = append(t.pend, p...)
		t.pend = nil
	}
	t.out = t.out[:0]
	for i := 0; i < len(in); {
		c1, n, ok := nextUnit(in[i:])
		if !ok {
			t.pend = append([]byte(nil), in[i:]...)
			break
		}
		t.step(in[i:i+n], c1)
		i += n
	}
	if len(t.out) > 0 {
		if _, err := t.w.Write(t.out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close ends the stream. An unfinished sequence was never sent and is
// not; an incomplete UTF-8 character is dropped too, so that nothing of
// it can combine with what pulse writes next.
func (t *termFilter) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch t.state {
	case stString, stStringEsc:
		t.noteOSC()
		t.hold("unterminated " + t.kind)
	case stCSI:
		t.hold("unterminated CSI")
	}
	t.state, t.pend, t.seq = stGround, nil, nil
	return nil
}

// heldBack lists, sorted, what the filters (nil ones are none) held back:
// each kind with how many times.
func heldBack(filters ...*termFilter) string {
	all := map[string]int{}
	for _, t := range filters {
		if t == nil {
			continue
		}
		t.mu.Lock()
		for k, n := range t.held {
			all[k] += n
		}
		t.mu.Unlock()
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(all)) {
		if all[k] == 1 {
			parts = append(parts, k)
		} else {
			parts = append(parts, fmt.Sprintf("%s ×%d", k, all[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// nextUnit reads one unit of b: a C1 control (c1 is its byte, 0x80 to
// 0x9f, sent as an 8-bit byte or UTF-8 encoded, as terminals take either),
// else one byte below 0x80, one valid UTF-8 character or one byte that is
// not UTF-8. ok is false when b holds only the start of a character.
func nextUnit(b []byte) (c1 byte, n int, ok bool) {
	switch c := b[0]; {
	case c < 0x80:
		return 0, 1, true
	case c <= 0x9f:
		return c, 1, true
	case c == 0xc2:
		if len(b) < 2 {
			return 0, 0, false
		}
		if b[1] >= 0x80 && b[1] <= 0x9f {
			return b[1], 2, true
		}
	}
	if !utf8.FullRune(b) {
		return 0, 0, false
	}
	_, n = utf8.DecodeRune(b)
	return 0, n, true // n is 1 for a byte that is not UTF-8 (0xa0 and up)
}

func (t *termFilter) hold(kind string) { t.held[kind]++ }

// step feeds one unit u (c1 set when it is a C1 control) to the filter.
func (t *termFilter) step(u []byte, c1 byte) {
	b := u[0]
	switch t.state {
	case stGround:
		switch {
		case c1 != 0:
			t.state = stEsc
			t.step([]byte{c1 - 0x40}, 0)
		case b == 0x1b:
			t.state = stEsc
		case b == '\n' || b == '\r' || b == '\t' || b == '\b' || b == 0x07:
			t.out = append(t.out, b)
		case b < 0x20 || b == 0x7f:
			t.hold(fmt.Sprintf("control 0x%02x", b))
		default:
			t.out = append(t.out, u...)
		}
	case stEsc:
		t.state = stGround
		switch {
		case c1 != 0 || len(u) > 1 || b >= 0x7f:
			t.step(u, c1) // not part of it: the ESC alone is dropped
		case b == 0x1b:
			t.state = stEsc
		case b == 0x18 || b == 0x1a: // CAN, SUB: cancelled
		case b < 0x20:
			t.step(u, 0)
		case b == '[':
			t.state, t.seq, t.bad = stCSI, append(t.seq[:0], 0x1b, '['), false
		case b == ']' || b == 'P' || b == 'X' || b == '^' || b == '_':
			t.state, t.kind = stString, map[byte]string{']': "OSC", 'P': "DCS", 'X': "SOS", '^': "PM", '_': "APC"}[b]
			if b == ']' {
				t.osc, t.oscOn = t.osc[:0], true
			} else {
				t.hold(t.kind)
			}
		case b == '7' || b == '8' || b == 'D' || b == 'E' || b == 'M':
			// Save and restore the cursor, index, next line, reverse
			// index: cursor moves on the screen.
			t.out = append(t.out, 0x1b, b)
		case b == '\\': // a stray string terminator
		case b < 0x30:
			t.state, t.kind = stEscInter, "ESC "+string(rune(b))
		default:
			t.hold("ESC " + string(rune(b)))
		}
	case stEscInter:
		switch {
		case c1 != 0 || len(u) > 1 || b >= 0x7f || b == 0x18 || b == 0x1a:
			t.hold(t.kind)
			t.state = stGround
			if c1 != 0 || len(u) > 1 || b >= 0x7f {
				t.step(u, c1)
			}
		case b == 0x1b:
			t.hold(t.kind)
			t.state = stEsc
		case b < 0x20:
			t.hold(t.kind)
			t.state = stGround
			t.step(u, 0)
		case b < 0x30:
		default:
			t.hold(t.kind + string(rune(b)))
			t.state = stGround
		}
	case stCSI:
		switch {
		case b == 0x7f && c1 == 0: // ignored inside a sequence, as terminals do
		case c1 != 0 || len(u) > 1 || b >= 0x80 || b < 0x20:
			// Not part of a sequence: it was never sent, and what came is
			// read afresh.
			t.hold("CSI (cut)")
			t.state = stGround
			if b != 0x18 && b != 0x1a || c1 != 0 {
				t.step(u, c1)
			}
		case b >= 0x40: // the final byte
			t.seq = append(t.seq, b)
			if !t.bad && allowedCSI(t.seq[2:]) {
				t.out = append(t.out, t.seq...)
			} else {
				t.hold(csiKind(t.seq[2:]))
			}
			t.state = stGround
		default:
			if b < 0x30 || len(t.seq) == 2 || t.seq[len(t.seq)-1] >= 0x30 {
				t.seq = append(t.seq, b)
			} else {
				t.bad = true // a parameter after an intermediate
			}
			if len(t.seq) > maxCSI {
				t.bad, t.seq = true, t.seq[:maxCSI]
			}
		}
	case stString:
		switch {
		case c1 == 0x9c, b == 0x18 && c1 == 0, b == 0x1a && c1 == 0,
			b == 0x07 && c1 == 0 && t.kind == "OSC": // ST, CAN, SUB, BEL
			t.endString()
		case b == 0x1b && c1 == 0:
			t.state = stStringEsc
		case t.oscOn && c1 == 0:
			if b >= '0' && b <= '9' && len(t.osc) < 8 {
				t.osc = append(t.osc, b)
			} else {
				t.noteOSC()
			}
		}
	case stStringEsc:
		t.endString()
		if b != '\\' || c1 != 0 || len(u) > 1 {
			t.state = stEsc
			t.step(u, c1)
		}
	}
}

// noteOSC counts the OSC being dropped under its number, once it is known.
func (t *termFilter) noteOSC() {
	if !t.oscOn {
		return
	}
	if len(t.osc) == 0 {
		t.hold("OSC")
	} else {
		t.hold("OSC " + string(t.osc))
	}
	t.oscOn = false
}

func (t *termFilter) endString() {
	t.noteOSC()
	t.state = stGround
}

// allowedCSI reports whether a control sequence (what follows its ESC [)
// only acts on the screen: colours and attributes, cursor moves, erasing
// the screen (not the scrollback), inserting and deleting, scrolling, the
// scroll region, and showing or hiding the cursor. Reports and queries
// (the terminal answers them as typed input), window operations, mouse
// and keyboard modes, the alternate screen and the rest are not.
func allowedCSI(s []byte) bool {
	final := s[len(s)-1]
	params := string(s[:len(s)-1])
	if strings.IndexFunc(params, func(r rune) bool { return r < 0x30 }) >= 0 {
		return false // an intermediate byte: DECSCUSR, DECSTR, DECRQM ...
	}
	numeric := func(extra string) bool {
		return strings.Trim(params, "0123456789;"+extra) == ""
	}
	switch final {
	case 'm': // SGR, colour sub-parameters with ':' too
		return numeric(":")
	case 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'f', 'd', 'e', '`', 'a',
		'@', 'L', 'M', 'P', 'X', 'S', 'I', 'Z', 'r':
		return numeric("")
	case 'T': // SD; with several parameters it starts mouse tracking
		return numeric("") && !strings.Contains(params, ";")
	case 'J', 'K': // ED 3 erases the scrollback
		return params == "" || params == "0" || params == "1" || params == "2"
	case 's', 'u':
		return params == ""
	case 'h', 'l':
		return params == "?25"
	}
	return false
}

// csiKind names a control sequence held back, by its prefix,
// intermediates and final byte ("CSI ? h", "CSI n").
func csiKind(s []byte) string {
	var b strings.Builder
	b.WriteString("CSI ")
	for _, c := range s {
		if c >= '0' && c <= '9' || c == ';' || c == ':' {
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
