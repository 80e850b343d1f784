package bidi

import (
	"testing"
	"unicode"
)

// TestIsControlIsUnicodesBidiControlSet: the set is Unicode's
// Bidi_Control property, no more, no less, over every rune.
func TestIsControlIsUnicodesBidiControlSet(t *testing.T) {
	n := 0
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := unicode.Is(unicode.Bidi_Control, r)
		if IsControl(r) != want {
			t.Errorf("IsControl(%U) = %v, want %v", r, !want, want)
		}
		if want {
			n++
		}
	}
	if n != 12 {
		t.Errorf("%d bidi controls, want 12", n)
	}
}

func TestContains(t *testing.T) {
	for s, want := range map[string]bool{
		"":                    false,
		"notes.md":            false,
		"notes\u202edm.sh":    true,
		"if x \u2066// y":     true,
		"caf\u00e9 \u200d ok": false, // a zero-width joiner reorders nothing
		"\u061c":              true,
	} {
		if Contains(s) != want {
			t.Errorf("Contains(%q) = %v, want %v", s, !want, want)
		}
	}
}
