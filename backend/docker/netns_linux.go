package docker

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// egressCapable reports whether this process can bridge the proxy into a
// container: only root may enter the engine's network namespaces.
func egressCapable() bool { return os.Geteuid() == 0 }

// listenInNetns listens on 127.0.0.1 (a free port) in the network
// namespace of process pid. The socket is made on a thread that entered
// that namespace; the thread goes back before it runs anything else, and
// is thrown away if it cannot.
func listenInNetns(pid int) (net.Listener, error) {
	target, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(target)
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer unix.Close(self)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("entering the container's network namespace: %w", err)}
			return
		}
		l, lerr := net.Listen("tcp4", "127.0.0.1:0")
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			// Still locked: the runtime ends this thread with the
			// goroutine, so nothing else runs in the container's
			// namespace by mistake.
			if l != nil {
				l.Close()
			}
			ch <- result{err: fmt.Errorf("leaving the container's network namespace: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{l: l, err: lerr}
	}()
	r := <-ch
	return r.l, r.err
}
