package cowfs

import (
	"strings"
	"testing"
)

// FuzzDiffApplies: for any two inputs, the diff of one against the other
// applies (read back strictly by applyHunks) and gives the second, or
// names them binary.
func FuzzDiffApplies(f *testing.F) {
	f.Add("", "a\n")
	f.Add("a\nb\nc\n", "a\nc\nd")
	f.Add("x", "x\n")
	f.Add("a\r\nb\r\n", "a\nb\r\n")
	f.Add("\x00", "a")
	f.Add(strings.Repeat("same\n", 50), strings.Repeat("same\n", 20)+"new\n"+strings.Repeat("same\n", 29))
	f.Fuzz(func(t *testing.T, a, b string) {
		checkApplies(t, a, b)
	})
}

// FuzzLineDiffTokens reads each byte as one line of a four-line
// vocabulary, so that the fuzzer explores inputs of heavily repeated
// lines (the histogram's fallback to Myers, the sliding of groups).
func FuzzLineDiffTokens(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0, 1}, []byte{0, 2, 3, 1, 1})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0}, []byte{0, 0, 0, 1, 0, 0, 0, 0, 0})
	f.Add([]byte{}, []byte{3, 3})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		vocab := []string{"a\n", "b\n", "\n", "}\n"}
		text := func(p []byte) string {
			var s strings.Builder
			for _, c := range p {
				s.WriteString(vocab[c%4])
			}
			return s.String()
		}
		checkApplies(t, text(a), text(b))
	})
}
