//go:build !linux

package main

import (
	"context"
	"io"
)

// viaDaemon: the daemon is Linux's; elsewhere every command runs in its
// own process.
func viaDaemon([]string) (int, bool) { return 0, false }

// cancelableStdin: never called where no daemon runs.
func cancelableStdin(_ context.Context, r io.Reader) (io.Reader, func()) { return r, func() {} }
