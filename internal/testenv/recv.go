package testenv

import (
	"testing"
	"time"
)

// Recv returns the next value from ch, or fails the test when none has
// arrived within `within`. A test that waits for a goroutine or another
// process (an Exec's result, a "started" signal, a server's answer) uses
// it instead of a bare receive, so that a lost wake-up fails with what was
// awaited instead of hanging until the test binary's timeout kills the
// whole package. As with Eventually, within bounds a hung test and is
// never an assertion about speed: make it generous (a minute or more for
// anything that runs a command). Call it from the test's goroutine only.
func Recv[T any](t testing.TB, ch <-chan T, within time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s, in vain", within, what)
		var zero T
		return zero
	}
}
