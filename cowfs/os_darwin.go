package cowfs

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// macOS builds cowfs so that the SDK and the CLI (with the host backend)
// build there; the capturing backends, and so the crash tests that hold
// cowfs to its promises, are Linux-only. The calls below are the nearest
// macOS has to the Linux ones; where one promises less, it says so.

// The renameatx_np(2) flags that do what rename2's renameat2 flags do.
const (
	renameNoReplace = unix.RENAME_EXCL
	renameExchange  = unix.RENAME_SWAP
)

// dirFlags opens the directories dirFD walks. macOS has no O_PATH: they
// are opened for reading, which needs read permission on each.
const dirFlags = unix.O_RDONLY

// renameat renames old to new, both names in directory fd, with flags.
func renameat(fd int, old, new string, flags uint) error {
	return unix.RenameatxNp(fd, old, fd, new, uint32(flags))
}

// flagsUnsupported reports that renameat refused its flags: a file system
// without atomic swap or exclusive rename (ENOTSUP), or flags it does not
// know (EINVAL).
func flagsUnsupported(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)
}

// syncFS makes what was written durable as far as macOS allows without
// syncfs(2): sync(2) schedules every dirty buffer for writing, and
// F_FULLFSYNC on fd waits for fd's own data and flushes the device's
// cache. Unlike Linux's syncfs, it does not wait for the other files'
// writeback to finish, so a power loss right after a commit may lose
// more here than on Linux.
func syncFS(fd int) error {
	if err := unix.Sync(); err != nil {
		return err
	}
	_, err := unix.FcntlInt(uintptr(fd), unix.F_FULLFSYNC, 0)
	return err
}

// mtimeNS is st's modification time in nanoseconds since the epoch.
func mtimeNS(st *syscall.Stat_t) int64 { return st.Mtimespec.Nano() }
