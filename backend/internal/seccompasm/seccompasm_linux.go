// Package seccompasm assembles the namespace backend's seccomp deny list
// into a BPF program with github.com/elastic/go-seccomp-bpf.
//
// It is a package of its own so that the library is linked only where it
// runs: the library builds its syscall tables for every architecture in
// its package init (about 1.5 ms of every process that links it, whatever
// the process does), so on architectures whose program is committed as
// generated code (backend/namespace's seccompprog_linux_*.go) only the
// test that checks that code links it, and the pulse binaries do not.
package seccompasm

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// Assemble returns the program that makes each of denied fail with EPERM,
// and clone with any of cloneFlags set, for the architecture this process
// runs on (the library assembles for runtime.GOARCH only). It is the
// program seccomp.LoadFilter would install for that policy with
// NoNewPrivs, without installing it.
func Assemble(denied []string, cloneFlags []uint64) ([]unix.SockFilter, error) {
	var clone []seccomp.NameWithConditions
	for _, f := range cloneFlags {
		clone = append(clone, seccomp.NameWithConditions{
			Name:       "clone",
			Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: f}},
		})
	}
	policy := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Names: denied, Action: seccomp.ActionErrno},
			{NamesWithCondtions: clone, Action: seccomp.ActionErrno},
		},
	}
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp policy: %w", err)
	}
	prog := make([]unix.SockFilter, 0, len(insts))
	for _, in := range insts {
		raw, err := in.Assemble()
		if err != nil {
			return nil, fmt.Errorf("assembling the seccomp policy: %w", err)
		}
		prog = append(prog, unix.SockFilter{Code: raw.Op, Jt: raw.Jt, Jf: raw.Jf, K: raw.K})
	}
	return prog, nil
}
