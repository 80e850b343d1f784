//go:build !linux

package initprog

func initSandbox() {}
