//go:build unix

package audit

import (
	"os"
	"syscall"
)

// flock takes or releases an exclusive advisory lock on f, retrying when a
// signal interrupts the wait.
func flock(f *os.File, lock bool) error {
	how := syscall.LOCK_UN
	if lock {
		how = syscall.LOCK_EX
	}
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}
