package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// fullName is the full pulse binary's name beside this one, as `make
// build` installs it; FullEnv names another (a file name, not a path).
const (
	fullName = "pulse-full"
	fullEnv  = "PULSE_FULL"
)

// fullBinary is the full pulse binary beside this one.
func fullBinary() string {
	name := os.Getenv(fullEnv)
	if name == "" || strings.ContainsRune(name, '/') {
		name = fullName
	}
	self, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(self), name)
}

// execFull runs the full binary in place of this process, under this
// program's name, as if it had been run directly; it returns only when
// that cannot be done, with the exit code to exit with.
func execFull(full string, args []string) int {
	// The full binary under this one's name would execute itself over
	// and over: a front end installed as pulse-full, or PULSE_FULL naming
	// the front end.
	if self, err := os.Executable(); err == nil {
		a, errA := os.Stat(self)
		b, errB := os.Stat(full)
		if errA == nil && errB == nil && os.SameFile(a, b) {
			fmt.Fprintf(os.Stderr, "pulse: %s is this front end itself, not the full pulse program\n", full)
			return 3
		}
	}
	err := syscall.Exec(full, append([]string{os.Args[0]}, args...), os.Environ())
	if os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "pulse: %s is missing: this pulse hands its commands to the full pulse program "+
			"installed beside it as %s (make build installs both; go install ./cmd/pulse installs the full one alone, as pulse)\n",
			full, fullName)
		return 3
	}
	fmt.Fprintf(os.Stderr, "pulse: %s: %v\n", full, err)
	return 3
}
