// Package initprog is the namespace backend's sandbox init for a program
// that links nothing of the backend's side: cmd/pulse-runtime, the one
// in-box runtime. It links only the init's own code (the backend's
// internal package nsinit: the standard library and golang.org/x/sys),
// so that each sandbox's pid 1 starts in little more than a Go hello
// world's time. Programs that embed the backend call namespace.Init instead,
// which is the same init.
package initprog

// Init turns this process into a sandbox init when the namespace backend
// started it, and returns at once otherwise; in a sandbox init it never
// returns (see namespace.Init).
func Init() { initSandbox() }
