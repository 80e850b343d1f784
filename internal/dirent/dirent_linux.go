package dirent

import (
	"bytes"
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Read calls fn with the name and type (unix.DT_*) of each entry of the
// open directory fd but "." and "..", reading it with getdents into buf.
// name is only valid during the call: it points into buf. A record that
// does not fit what the kernel writes is reported as unix.EIO rather than
// read past; getdents interrupted by a signal is retried.
func Read(fd int, buf []byte, fn func(name []byte, typ uint8)) error {
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		// struct linux_dirent64: ino (8), off (8), reclen (2), type (1),
		// then the NUL-terminated name, padded to reclen.
		for b := buf[:n]; len(b) > 0; {
			if len(b) < 19 {
				return unix.EIO
			}
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return unix.EIO
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if !(len(name) == 1 && name[0] == '.' || len(name) == 2 && name[0] == '.' && name[1] == '.') {
				fn(name, b[18])
			}
			b = b[reclen:]
		}
	}
}
