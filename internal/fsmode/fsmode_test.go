package fsmode

import (
	"archive/tar"
	"io/fs"
	"testing"
	"time"
)

// TestRoundTrip: ToUnix and FromUnix are inverses on the twelve
// permission and special bits.
func TestRoundTrip(t *testing.T) {
	for u := uint32(0); u <= 0o7777; u++ {
		if got := ToUnix(FromUnix(u)); got != u {
			t.Fatalf("ToUnix(FromUnix(%#o)) = %#o", u, got)
		}
	}
}

// TestBits: each special bit lands where the other side keeps it, and
// type bits are dropped on the way to Unix and ignored on the way back.
func TestBits(t *testing.T) {
	for _, c := range []struct {
		u uint32
		m fs.FileMode
	}{
		{0o4755, fs.ModeSetuid | 0o755},
		{0o2750, fs.ModeSetgid | 0o750},
		{0o1777, fs.ModeSticky | 0o777},
		{0o7000, fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky},
		{0o644, 0o644},
	} {
		if got := FromUnix(c.u); got != c.m {
			t.Errorf("FromUnix(%#o) = %v, want %v", c.u, got, c.m)
		}
		if got := ToUnix(c.m); got != c.u {
			t.Errorf("ToUnix(%v) = %#o, want %#o", c.m, got, c.u)
		}
	}
	if got := ToUnix(fs.ModeDir | fs.ModeSetgid | 0o755); got != 0o2755 {
		t.Errorf("ToUnix of a setgid directory = %#o, want 02755 (type bits dropped)", got)
	}
	if got := FromUnix(0o040755); got != 0o755 {
		t.Errorf("FromUnix(0o040755) = %v, want 0o755 (S_IFDIR ignored)", got)
	}
}

// TestAgreesWithTar: the conversion is the one archive/tar uses for its
// headers, in both directions, so tar members and stat results agree.
func TestAgreesWithTar(t *testing.T) {
	for u := uint32(0); u <= 0o7777; u++ {
		m := FromUnix(u)
		h, err := tar.FileInfoHeader(fileInfo{m}, "")
		if err != nil {
			t.Fatal(err)
		}
		if uint32(h.Mode) != u {
			t.Fatalf("tar header of %v has mode %#o, ToUnix gives %#o", m, h.Mode, u)
		}
		special := fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky
		if got := h.FileInfo().Mode() & special; got != m {
			t.Fatalf("tar reads mode %#o as %v, FromUnix gives %v", u, got, m)
		}
	}
}

type fileInfo struct{ m fs.FileMode }

func (f fileInfo) Name() string       { return "f" }
func (f fileInfo) Size() int64        { return 0 }
func (f fileInfo) Mode() fs.FileMode  { return f.m }
func (f fileInfo) ModTime() time.Time { return time.Time{} }
func (f fileInfo) IsDir() bool        { return false }
func (f fileInfo) Sys() any           { return nil }
