//go:build !linux

package main

import "os"

// Where there is no daemon, every command is the full binary's.
func main() {
	os.Exit(execFull(fullBinary(), os.Args[1:]))
}
