package cowfs

import (
	"io/fs"
	"testing"
)

// TestModeConversion: unixMode and fileMode are inverses on the twelve
// permission and special bits, and put each special bit where the other
// side keeps it.
func TestModeConversion(t *testing.T) {
	for u := uint32(0); u <= 0o7777; u++ {
		if got := unixMode(fileMode(u)); got != u {
			t.Fatalf("unixMode(fileMode(%#o)) = %#o", u, got)
		}
	}
	for _, c := range []struct {
		u uint32
		m fs.FileMode
	}{
		{0o4755, fs.ModeSetuid | 0o755},
		{0o2750, fs.ModeSetgid | 0o750},
		{0o1777, fs.ModeSticky | 0o777},
		{0o644, 0o644},
	} {
		if got := fileMode(c.u); got != c.m {
			t.Errorf("fileMode(%#o) = %v, want %v", c.u, got, c.m)
		}
	}
	if got := unixMode(fs.ModeDir | fs.ModeSetgid | 0o755); got != 0o2755 {
		t.Errorf("unixMode of a setgid directory = %#o, want 02755 (type bits dropped)", got)
	}
}
