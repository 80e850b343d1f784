//go:build linux && !amd64

package namespace

import (
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend/internal/seccompasm"
)

// compiledSeccomp returns the deny list's BPF program, assembled once per
// process and sent to every init: the policy is a constant, so assembling
// it in each init would only repeat the same work on the critical path.
// On amd64 the program is committed as generated code instead
// (seccompprog_linux_amd64.go), so that the pulse binaries do not link
// the assembler's library and pay its package init.
// Each caller gets a copy of its own, as on amd64.
func compiledSeccomp() ([]unix.SockFilter, error) {
	prog, err := assembledSeccomp()
	return slices.Clone(prog), err
}

var assembledSeccomp = sync.OnceValues(func() ([]unix.SockFilter, error) {
	return seccompasm.Assemble(deniedSyscalls, namespaceCloneFlags)
})
