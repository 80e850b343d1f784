//go:build !linux

package backend

import "io"

// GrowPipe does nothing here: only Linux can resize a pipe.
func GrowPipe(any) {}

// GrowBulk does nothing here: only Linux can resize a pipe.
func GrowBulk(any) bool { return false }

// PollReadable, WaitReadable and Nap are Linux's: elsewhere each read
// waits in the netpoller.
func PollReadable(int) bool  { return true }
func WaitReadable(io.Reader) {}
func Nap()                   {}
