package capture

import "github.com/pulse-agent/pulse/internal/dirent"

// readNames appends prefix+name for each name in the open directory fd,
// but for "." and "..", to names, reading it with getdents into buf.
func readNames(fd int, buf []byte, prefix string, names []string) ([]string, error) {
	err := dirent.Read(fd, buf, func(name []byte, _ uint8) {
		names = append(names, prefix+string(name))
	})
	return names, err
}
