package testenv

import (
	"fmt"
	"testing"
	"time"
)

// Eventually calls cond until it returns nil, waiting a little longer
// between calls each time (from 1ms up to 50ms), and fails the test with
// cond's last error when within has passed without success. It is for
// state that another process or goroutine reaches in its own time; the
// deadline is a bound on a hung test, never an assertion about speed, so
// make it generous. Call it from the test's goroutine only (it may call
// t.Fatal).
func Eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	if err := Poll(within, cond); err != nil {
		t.Fatal(err)
	}
}

// Poll is Eventually without a test: it returns nil once cond does, or
// an error wrapping cond's last error when within has passed. It is for
// goroutines other than the test's and for helpers that report failure
// their own way.
func Poll(within time.Duration, cond func() error) error {
	deadline := time.Now().Add(within)
	wait := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not so within %v: %w", within, err)
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}
