// Package fsmode converts between fs.FileMode and the Unix mode bits that
// stat, chmod, tar headers and the project's own records carry. The two
// spell the setuid, setgid and sticky bits differently (fs.FileMode keeps
// them high, beside the type bits; Unix keeps them at 0o7000), so every
// place that crosses between them needs the same table: this is it.
// It is a leaf: it imports only the standard library, so public packages
// may use it.
package fsmode

import "io/fs"

// The special bits' Unix values are fixed by POSIX (and by the tar
// format), the same on every system.
var specialBits = [...]struct {
	goBit   fs.FileMode
	unixBit uint32
}{
	{fs.ModeSetuid, 0o4000},
	{fs.ModeSetgid, 0o2000},
	{fs.ModeSticky, 0o1000},
}

// ToUnix returns the twelve permission and special bits of m as Unix
// spells them. Type bits (directory, symlink, ...) are dropped: callers
// carry the type apart from the mode.
func ToUnix(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	for _, b := range specialBits {
		if m&b.goBit != 0 {
			u |= b.unixBit
		}
	}
	return u
}

// FromUnix returns the permission and special bits of the Unix mode u as
// an fs.FileMode. Bits above 0o7777 (the file type) are ignored.
func FromUnix(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	for _, b := range specialBits {
		if u&b.unixBit != 0 {
			m |= b.goBit
		}
	}
	return m
}
