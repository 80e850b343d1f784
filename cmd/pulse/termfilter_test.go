package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// filterAll runs in through a termFilter cut into writes at cuts (each a
// length, taken modulo what is left; 0 means the rest) and returns what
// the terminal would receive and what was held back.
func filterAll(in []byte, cuts []byte) (string, string) {
	var out bytes.Buffer
	f := newTermFilter(&out)
	for len(in) > 0 {
		n := len(in)
		if len(cuts) > 0 {
			if c := int(cuts[0]) % (len(in) + 1); c > 0 {
				n = c
			}
			cuts = cuts[1:]
		}
		f.Write(in[:n])
		in = in[n:]
	}
	f.Close()
	return out.String(), heldBack(f)
}

func TestTermFilter(t *testing.T) {
	for _, c := range []struct{ name, in, want, held string }{
		{"plain text", "hello\nwörld ✓\ttab\r\n", "hello\nwörld ✓\ttab\r\n", ""},
		{"colours", "\x1b[1;31mred\x1b[0m \x1b[38:2::1:2:3mx\x1b[m", "\x1b[1;31mred\x1b[0m \x1b[38:2::1:2:3mx\x1b[m", ""},
		{"progress bar", "\x1b[?25l 10%\r\x1b[2K 20%\x1b[1A\x1b[3G\x1b7\x1b8\x1b[?25h", "\x1b[?25l 10%\r\x1b[2K 20%\x1b[1A\x1b[3G\x1b7\x1b8\x1b[?25h", ""},
		{"a character whose last byte is 0x9b", "\u271b", "\u271b", ""},
		{"clipboard, BEL", "a\x1b]52;c;ZXZpbA==\x07b", "ab", "OSC 52"},
		{"background, ST", "\x1b]11;rgb:0000/0000/0000\x1b\\fake", "fake", "OSC 11"},
		{"title and links", "\x1b]0;pwned\x07\x1b]8;;http://evil.test/\x1b\\click\x1b]8;;\x1b\\", "click", "OSC 0, OSC 8 ×2"},
		{"an OSC cancelled", "\x1b]2;t\x18x", "x", "OSC 2"},
		{"an OSC ended by another sequence", "\x1b]10;#000\x1b[31mx", "\x1b[31mx", "OSC 10"},
		{"tmux passthrough", "\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\after", "after", "DCS, OSC 52"},
		{"APC, PM, SOS", "\x1b_Gf=100;AAAA\x1b\\1\x1b^pm\x1b\\2\x1bXsos\x1b\\3", "123", "APC, PM, SOS"},
		{"8-bit OSC", "\x9d52;c;eA==\x07y", "y", "OSC 52"},
		{"8-bit OSC ended by 8-bit ST", "\x9d0;t\x9cy", "y", "OSC 0"},
		{"UTF-8 encoded OSC and ST", "\u009d0;title\u009cz", "z", "OSC 0"},
		{"8-bit CSI becomes 7-bit", "\x9b31mred", "\x1b[31mred", ""},
		{"UTF-8 encoded CSI", "\u009b2J", "\x1b[2J", ""},
		{"8-bit DCS, APC", "\x90q\x9c\x9fx\x9cy", "y", "APC, DCS"},
		{"queries the terminal answers", "\x1b[6n\x1b[c\x1b[>c\x1b[21t\x1b[?1$p", "", "CSI >c, CSI ?$p, CSI c, CSI n, CSI t"},
		{"modes", "\x1b[?1049h\x1b[?1000h\x1b[?2004h\x1b[4h\x1b[>1u", "", "CSI >u, CSI ?h ×3, CSI h"},
		{"the scrollback", "\x1b[3Jx", "x", "CSI J"},
		{"other escapes", "\x1bc\x1b(0\x1b#8\x1bZx", "x", "ESC #8, ESC (0, ESC Z, ESC c"},
		{"controls", "a\x05b\x0ec\x0fd\x00", "abcd", "control 0x00, control 0x05, control 0x0e, control 0x0f"},
		{"a CSI cut by a newline", "\x1b[31\nx", "\nx", "CSI (cut)"},
		{"a CSI too long", "\x1b[" + strings.Repeat("1;", 200) + "mx", "x", "CSI m"},
		{"unterminated at the end", "x\x1b]52;c;abc", "x", "OSC 52, unterminated OSC"},
		{"a CSI unfinished at the end", "x\x1b[31", "x", "unterminated CSI"},
		{"a character unfinished at the end", "x\xe2\x9c", "x", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, held := filterAll([]byte(c.in), nil)
			if got != c.want || held != c.held {
				t.Fatalf("filter(%q) = %q, held %q; want %q, held %q", c.in, got, held, c.want, c.held)
			}
			// One byte a write gives the same.
			if got1, held1 := filterAll([]byte(c.in), bytes.Repeat([]byte{1}, len(c.in))); got1 != got || held1 != held {
				t.Fatalf("byte by byte: %q, held %q", got1, held1)
			}
			if err := checkTermOutput([]byte(got)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkTermOutput is the filter's promise, checked on what it wrote
// without its parser: only the C0 controls text uses, no C1 control in any
// form, and each ESC the start of a complete sequence that stays on the
// screen (ESC 7, 8, D, E, M, or a CSI of the allowed kinds).
func checkTermOutput(out []byte) error {
	for i := 0; i < len(out); {
		c := out[i]
		switch {
		case c == 0x1b:
			if i+1 == len(out) {
				return fmt.Errorf("a lone ESC at the end of %q", out)
			}
			if strings.IndexByte("78DEM", out[i+1]) >= 0 {
				i += 2
				continue
			}
			if out[i+1] != '[' {
				return fmt.Errorf("ESC %q at %d in %q", out[i+1], i, out)
			}
			j := i + 2
			for j < len(out) && out[j] >= 0x30 && out[j] <= 0x3f {
				j++
			}
			if j == len(out) || strings.IndexByte("mABCDEFGHfde`a@LMPXSITZrJKsuhl", out[j]) < 0 {
				return fmt.Errorf("CSI %q at %d in %q", out[i:min(j+1, len(out))], i, out)
			}
			params := string(out[i+2 : j])
			switch {
			case strings.ContainsAny(params, "<=>") || strings.Contains(params, "?") && params != "?25",
				(out[j] == 'h' || out[j] == 'l') && params != "?25",
				(out[j] == 'J' || out[j] == 'K') && strings.Contains(params, "3"):
				return fmt.Errorf("CSI %q at %d in %q", out[i:j+1], i, out)
			}
			i = j + 1
		case c == 0x7f || c < 0x20 && strings.IndexByte("\n\r\t\b\a", c) < 0:
			return fmt.Errorf("control 0x%02x at %d in %q", c, i, out)
		case c >= 0x80:
			r, n := utf8.DecodeRune(out[i:])
			if (r == utf8.RuneError && n == 1 && c <= 0x9f) || (r >= 0x80 && r <= 0x9f) {
				return fmt.Errorf("C1 control at %d in %q", i, out)
			}
			i += n
		default:
			i++
		}
	}
	return nil
}

// plainText keeps of b what a program's ordinary output is made of —
// printable characters, newlines, tabs, carriage returns — and turns each
// ESC into an SGR colour.
func plainText(b []byte) []byte {
	var out []byte
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r == 0x1b:
			out = append(out, fmt.Sprintf("\x1b[%d;38;5;%dm", len(b)%2, len(b)%256)...)
		case r == '\n' || r == '\t' || r == '\r':
			out = append(out, b[0])
		case r != utf8.RuneError && unicode.IsPrint(r):
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// FuzzTermFilter: whatever a command writes, and however its writes are
// cut, the terminal gets only text and sequences that stay on the
// screen, the same for every cut; ordinary text and SGR colours pass
// byte for byte.
func FuzzTermFilter(f *testing.F) {
	for _, s := range []string{
		"\x1b]52;c;ZXZpbA==\x07", "\x1b]11;rgb:0/0/0\x1b\\", "\x9d0;t\x9c", "\u009d8;;x\u009c",
		"\x1bPtmux;\x1b\x1b]52;c;x\x07\x1b\\", "\x1b[6n\x1b[?1049h", "\x1b[1;31mred\x1b[0m", "\x9b31m",
		"✛\xe2\x9c\x9b\xc2\x9b", "\x1b_G\x1b\\\x1b^\x1bX\x9c", "\x1b[31\n", "\x1b(0\x0e\x05",
	} {
		f.Add([]byte(s), []byte{1, 2, 3})
	}
	f.Fuzz(func(t *testing.T, in, cuts []byte) {
		whole, held := filterAll(in, nil)
		if err := checkTermOutput([]byte(whole)); err != nil {
			t.Fatal(err)
		}
		if cut, cutHeld := filterAll(in, cuts); cut != whole || cutHeld != held {
			t.Fatalf("cut %v: %q held %q; whole: %q held %q", cuts, cut, cutHeld, whole, held)
		}
		plain := plainText(in)
		if got, held := filterAll(plain, cuts); got != string(plain) || held != "" {
			t.Fatalf("plain text %q came out as %q (held %q)", plain, got, held)
		}
	})
}
