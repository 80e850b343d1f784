package backend

import (
	"bytes"
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// readNames appends prefix+name for each name in the open directory fd,
// but for "." and "..", to names, reading it with getdents into buf.
func readNames(fd int, buf []byte, prefix string, names []string) ([]string, error) {
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return names, err
		}
		if n <= 0 {
			return names, nil
		}
		// struct linux_dirent64: ino (8), off (8), reclen (2), type (1),
		// then the NUL-terminated name, padded to reclen.
		for b := buf[:n]; len(b) > 0; {
			if len(b) < 19 {
				return names, unix.EIO
			}
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return names, unix.EIO
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if !(len(name) == 1 && name[0] == '.' || len(name) == 2 && name[0] == '.' && name[1] == '.') {
				names = append(names, prefix+string(name))
			}
			b = b[reclen:]
		}
	}
}
