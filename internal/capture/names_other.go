//go:build !linux

package capture

import (
	"os"

	"golang.org/x/sys/unix"
)

// readNames appends prefix+name for each name in the open directory fd,
// but for "." and "..", to names. It reads a duplicate of fd, which os
// closes.
func readNames(fd int, _ []byte, prefix string, names []string) ([]string, error) {
	d, err := unix.Dup(fd)
	if err != nil {
		return names, err
	}
	f := os.NewFile(uintptr(d), "")
	defer f.Close()
	all, err := f.Readdirnames(-1)
	for _, name := range all {
		names = append(names, prefix+name)
	}
	return names, err
}
