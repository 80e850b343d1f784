package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

var (
	// ErrNoNamespace: the process's namespace could not be opened (the
	// process is gone, or it is not ours to see).
	ErrNoNamespace = errors.New("netns: the process's network namespace cannot be opened")
	// ErrEnter: setns refused (it takes CAP_SYS_ADMIN in the namespace's
	// owner and in the caller's own user namespace).
	ErrEnter = errors.New("netns: cannot enter the network namespace")
	// ErrLeave: the thread could not go back; fn ran, and whatever it
	// made is the caller's to close.
	ErrLeave = errors.New("netns: cannot go back to this process's network namespace")
)

// Do runs fn on an OS thread that has entered the network namespace of
// process pid, and returns once the thread is back in its own. A socket
// fn makes keeps the namespace it was made in, so fn's results outlive
// the call; the runtime starts no thread from a locked one, so nothing
// fn does escapes into another namespace.
func Do(pid int, fn func()) error {
	target, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoNamespace, err)
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("%w: %w", ErrEnter, err)
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("%w: %w", ErrEnter, err)
			return
		}
		fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// Still locked: the runtime ends this thread with the
			// goroutine.
			done <- fmt.Errorf("%w: %w", ErrLeave, err)
			return
		}
		runtime.UnlockOSThread()
		done <- nil
	}()
	return <-done
}
