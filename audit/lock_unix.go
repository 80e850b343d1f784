//go:build unix

package audit

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
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

// flockCtx takes the lock like flock, but gives up when ctx ends: a
// process stopped while holding the lock must not hang every other writer
// for ever. A blocking flock cannot be interrupted, so a context that can
// end is served by polling with a short backoff; one that cannot end
// (context.Background) waits in the kernel, which is fairer and cheaper.
func flockCtx(ctx context.Context, f *os.File) error {
	if ctx.Done() == nil {
		return flock(f, true)
	}
	delay := 50 * time.Microsecond
	var timer *time.Timer
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && err != syscall.EINTR {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		delay = min(delay*2, 5*time.Millisecond)
	}
}

// flockShared takes a shared advisory lock on f: readers that must not see
// a record half rewritten, while writers hold it exclusively.
func flockShared(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
		if err != syscall.EINTR {
			return err
		}
	}
}
