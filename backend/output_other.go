//go:build !linux

package backend

// GrowPipe does nothing here: only Linux can resize a pipe.
func GrowPipe(any) {}

// GrowBulk does nothing here: only Linux can resize a pipe.
func GrowBulk(any) bool { return false }
