//go:build linux && (amd64 || arm64)

package hugeheap

import (
	"syscall"
	"unsafe"
)

// arenaBytes is the Go heap's arena size and alignment on 64-bit Linux
// (runtime.heapArenaBytes): the heap grows within the arena of its first
// allocation long past what a short process uses. pmdBytes is the size
// of a transparent huge page with 4 KiB base pages.
const (
	arenaBytes = 64 << 20
	pmdBytes   = 2 << 20
)

// Not in package syscall; the values are the kernel's (asm-generic
// mman-common.h), the same on amd64 and arm64.
const (
	madvHugepage = 14
	madvCollapse = 25
)

// probe is a heap object: where it lies is where the heap is. A package
// variable, so that the allocation escapes to the heap.
var probe *[64]byte

// init runs before the package initialisers that allocate much: this
// package imports only syscall, and the runtime initialises, of the
// packages whose imports are done, the first in import path order, in
// which github.com/pulse-agent sorts before most of the standard library
// (in the pulse binary it is the 14th of 137, `GODEBUG=inittrace=1`).
// What was faulted in before it (the runtime's own start) stays in small
// pages unless the collapse below copies it.
func init() {
	if v, _ := syscall.Getenv(Env); v == "0" {
		return
	}
	probe = new([64]byte)
	p := uintptr(unsafe.Pointer(probe))
	// The whole arena: every later fault in it that finds its 2 MiB
	// range untouched gets a huge page.
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, p&^(arenaBytes-1), arenaBytes, madvHugepage); e != 0 {
		return // no THP in this kernel (EINVAL), or none for us
	}
	applied = true
	// The heap's first 2 MiB are already partly touched, so the kernel
	// would leave them in small pages; collapsing them (Linux 6.1) makes
	// the rest of that range fault-free. An older kernel (EINVAL) or no
	// huge page to be had (EAGAIN, ENOMEM) leaves them as they are.
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, p&^(pmdBytes-1), pmdBytes, madvCollapse)
}
