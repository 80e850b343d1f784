package backend

import (
	"os"
	"sync"
)

var prewarmStart sync.Once

// PrewarmProcessStart has the Go runtime's one-time check of what it
// needs to start processes made now, in the background, so that it is
// done by the time a backend starts its first process instead of
// delaying it: on Linux, os.StartProcess checks once per process that
// pidfds work (pidfd_open, waitid, pidfd_send_signal, and a throwaway
// vfork'd child), and a CLI process, which starts one command, would
// otherwise pay for that child on its way to the command. os.FindProcess
// runs the same check (a pidfd of this process, closed at once). Calling
// it more than once costs nothing; elsewhere it does next to nothing.
func PrewarmProcessStart() {
	prewarmStart.Do(func() {
		go func() {
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Release()
			}
		}()
	})
}
