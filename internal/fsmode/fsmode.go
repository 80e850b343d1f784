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

// The file type bits of st_mode (S_IFMT and its values), fixed by POSIX
// and the same on every system this builds for.
const (
	typeMask = 0o170000
	typeDir  = 0o040000
	typeLink = 0o120000
	typeChr  = 0o020000
	typeBlk  = 0o060000
	typeFIFO = 0o010000
	typeSock = 0o140000
)

// FromStat returns a whole st_mode (the type and the permission and
// special bits) as an fs.FileMode, as os.Lstat would give it.
func FromStat(u uint32) fs.FileMode {
	m := FromUnix(u)
	switch u & typeMask {
	case typeDir:
		m |= fs.ModeDir
	case typeLink:
		m |= fs.ModeSymlink
	case typeChr:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case typeBlk:
		m |= fs.ModeDevice
	case typeFIFO:
		m |= fs.ModeNamedPipe
	case typeSock:
		m |= fs.ModeSocket
	}
	return m
}
