package randhex

import (
	"encoding/hex"
	"testing"
)

func TestString(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range []int{1, 6, 8, 12, 16, 24} {
		for range 100 {
			s := String(n)
			if len(s) != 2*n {
				t.Fatalf("String(%d) = %q: want %d hex digits", n, s, 2*n)
			}
			if b, err := hex.DecodeString(s); err != nil || len(b) != n || hex.EncodeToString(b) != s {
				t.Fatalf("String(%d) = %q: not lower-case hex", n, s)
			}
			if n >= 8 {
				if seen[s] {
					t.Fatalf("String(%d) repeated %q", n, s)
				}
				seen[s] = true
			}
		}
	}
	if String(0) != "" {
		t.Fatal("String(0) is not empty")
	}
}
