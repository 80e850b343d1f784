package server

import "unicode/utf8"

// toText decodes b as UTF-8, replacing each invalid byte with U+FFFD as
// Python's decode(errors="replace") does.
func toText(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
			b = b[1:]
			continue
		}
		out = append(out, b[:n]...)
		b = b[n:]
	}
	return out
}

// splitUTF8 returns the longest prefix of b that does not end inside a
// multi-byte sequence that the next chunk could still complete, and the
// rest. Holding that rest back keeps a character split across two reads
// intact instead of turning it into two replacement characters.
func splitUTF8(b []byte) (head, tail []byte) {
	for k := 1; k <= utf8.UTFMax-1 && k <= len(b); k++ {
		c := b[len(b)-k]
		if c < utf8.RuneSelf {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-k:]) {
				return b[:len(b)-k], b[len(b)-k:]
			}
			break
		}
	}
	return b, nil
}
