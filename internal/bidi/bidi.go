// Package bidi names the Unicode bidirectional formatting characters:
// the runes that make text display in another order than it is read by a
// program (Trojan Source, CVE-2021-42574). A file name or a diff line that
// holds one can show a reviewer something else than what is committed:
// "notes<U+202E>dm.sh" displays as "noteshs.md". Review text (the
// terminal, the review page) shows each as a visible marker instead.
package bidi

import "strings"

// IsControl reports whether r is a bidirectional formatting character:
// the marks (U+200E, U+200F, U+061C), the embeddings and overrides
// (U+202A–U+202E) and the isolates (U+2066–U+2069).
func IsControl(r rune) bool {
	switch {
	case r == 0x200e || r == 0x200f || r == 0x061c:
		return true
	case r >= 0x202a && r <= 0x202e:
		return true
	case r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Contains reports whether s holds a bidirectional formatting character.
func Contains(s string) bool {
	return strings.IndexFunc(s, IsControl) >= 0
}
