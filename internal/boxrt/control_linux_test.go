package boxrt

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// A child started from a thread other than the main one is listed under
// that thread: firstChild finds it there. The signal step looked only at
// the main thread's list, so a signal to a terminal command whose
// runtime had started it from another thread found no command.
func TestFirstChildOnAnyThread(t *testing.T) {
	type started struct {
		pid, tid int
		err      error
	}
	ch, release, reaped := make(chan started), make(chan struct{}), make(chan struct{})
	// The child is gone before the test ends, so a next run (-count)
	// finds only its own.
	defer func() { close(release); <-reaped }()
	// start runs on a thread of its own, locked, and keeps that thread
	// until release: a child whose thread ended would be another's.
	start := func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(reaped)
		c := exec.Command("sleep", "30")
		if err := c.Start(); err != nil {
			ch <- started{err: err}
			return
		}
		ch <- started{pid: c.Process.Pid, tid: unix.Gettid()}
		<-release
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if unix.Gettid() != os.Getpid() {
			start()
			return
		}
		// This goroutine holds the main thread: another gets another.
		done := make(chan struct{})
		go func() { start(); close(done) }()
		<-done
	}()
	s := <-ch
	if s.err != nil {
		t.Fatal(s.err)
	}
	if s.tid == os.Getpid() {
		t.Fatal("the child was started from the main thread; the test needs another")
	}
	if got := firstChild(strconv.Itoa(os.Getpid())); got != strconv.Itoa(s.pid) {
		t.Fatalf("firstChild = %q, want %d (started from thread %d, not the main one)", got, s.pid, s.tid)
	}
}
