package cowfs

import "testing"

// TestLowerHex: ids and sums are accepted only as cowfs writes them.
func TestLowerHex(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want bool
	}{
		{"0123456789abcdef", 16, true},
		{"0123456789ABCDEF", 16, false}, // upper case is another file name
		{"0123456789abcde", 16, false},
		{"0123456789abcdef0", 16, false},
		{"0123456789abcdeg", 16, false},
		{"../../../etc/pas", 16, false},
		{"", 0, true},
	} {
		if got := lowerHex(c.s, c.n); got != c.want {
			t.Errorf("lowerHex(%q, %d) = %v, want %v", c.s, c.n, got, c.want)
		}
	}
	if !validSHA("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") || validSHA("e3b0c442") {
		t.Error("validSHA takes 64 lowercase hex digits only")
	}
	if !validID("00000000000000ff") || validID("00000000000000FF") {
		t.Error("validID takes 16 lowercase hex digits only")
	}
}
