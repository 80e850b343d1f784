//go:build unix

package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// ErrLocked is returned by TryLock when another open file holds the lock.
var ErrLocked = errors.New("flock: held by another open file")

// The backoff between tries while a cancellable wait polls.
const (
	firstDelay = 50 * time.Microsecond
	maxDelay   = 10 * time.Millisecond
)

// Lock takes an exclusive lock on f, waiting until it is free or ctx is
// done (then it returns ctx.Err()).
func Lock(ctx context.Context, f *os.File) error {
	return lock(ctx, f, syscall.LOCK_EX)
}

// LockShared takes a shared lock on f (readers that must not see a record
// half rewritten, while writers hold it exclusively), waiting like Lock.
func LockShared(ctx context.Context, f *os.File) error {
	return lock(ctx, f, syscall.LOCK_SH)
}

// TryLock takes an exclusive lock on f if no one holds it, and returns
// ErrLocked (wrapping EWOULDBLOCK) if someone does.
func TryLock(f *os.File) error { return tryLock(f, syscall.LOCK_EX) }

// TryLockShared takes a shared lock on f unless someone holds it
// exclusively, and returns ErrLocked (wrapping EWOULDBLOCK) if someone does.
func TryLockShared(f *os.File) error { return tryLock(f, syscall.LOCK_SH) }

func tryLock(f *os.File, how int) error {
	err := retry(f, how|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return fmt.Errorf("%w: %w", ErrLocked, err)
	}
	return err
}

// Unlock releases the lock f holds. Closing f's last descriptor does too.
func Unlock(f *os.File) error {
	return retry(f, syscall.LOCK_UN)
}

func lock(ctx context.Context, f *os.File, how int) error {
	if ctx.Done() == nil {
		return retry(f, how)
	}
	delay := firstDelay
	var timer *time.Timer
	for {
		err := retry(f, how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) {
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
		delay = min(delay*2, maxDelay)
	}
}

// retry calls flock, again when a signal interrupted it.
func retry(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}
