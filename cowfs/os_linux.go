package cowfs

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// The renameat2(2) flags rename2 takes.
const (
	renameNoReplace = unix.RENAME_NOREPLACE
	renameExchange  = unix.RENAME_EXCHANGE
)

// dirFlags opens the directories dirFD walks: O_PATH, which needs no read
// permission on them, as a path lookup through them does not.
const dirFlags = unix.O_PATH

// renameat renames old to new, both names in directory fd, with flags.
func renameat(fd int, old, new string, flags uint) error {
	return unix.Renameat2(fd, old, fd, new, flags)
}

// flagsUnsupported reports that renameat refused its flags: an old kernel
// (ENOSYS) or a file system that knows neither (EINVAL, EOPNOTSUPP).
func flagsUnsupported(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)
}

// syncFS makes everything written to the file system of fd durable:
// syncfs(2) waits for the data and metadata of every inode of the file
// system and flushes the device cache, and reports writeback errors since
// Linux 5.8.
func syncFS(fd int) error { return unix.Syncfs(fd) }

// mtimeNS is st's modification time in nanoseconds since the epoch.
func mtimeNS(st *syscall.Stat_t) int64 { return st.Mtim.Nano() }
