// Package hugeheap asks the kernel to back a program's Go heap with
// transparent huge pages, from the program's first package initialiser
// on. A program opts in by importing it for its side effect:
//
//	import _ "github.com/pulse-agent/pulse/internal/hugeheap"
//
// Why: a `pulse` command is a short process, and on the virtual machines
// it runs on a page fault is the most expensive thing such a process
// does: 12-17 µs per first touch of a 4 KiB page on this project's 2-core
// machine class, against ~0.4 µs a 4 KiB page when the kernel hands out a
// 2 MiB page at once. Starting the pulse binary touches ~1.5 MiB of fresh
// heap (the package initialisers of the Docker client, the MCP SDK and
// YAML allocate ~720 KiB before main), ~400 faults. With the heap's arena
// marked MADV_HUGEPAGE and its first 2 MiB collapsed into one huge page
// (MADV_COLLAPSE), `pulse --help` took 426 faults instead of 729, and
// 15.1 ms instead of 21.9 (hyperfine, alternating); a host `pulse exec
// true` 22.2 ms instead of 29.5.
//
// The Go runtime marks some of its own metadata so, not the heap (it
// stopped doing that after Go 1.21.0, for long-running servers whose huge
// pages its scavenger kept splitting), and the kernel's default THP mode,
// madvise, gives huge pages only to memory so marked. What it costs: up
// to 2 MiB more resident memory per partly used huge page of heap, a few
// MiB for a pulse process, and the collapse, ~0.5 ms (up to 3.5 ms seen).
// Since Go 1.26 the heap starts at a random offset in its arena, and in
// part of the starts the runtime maps heap it needs after this init as a
// mapping of its own, without the mark: a `pulse version` then takes
// 600-760 faults instead of 430-460 (730-800 unmarked), about half of the
// starts on this machine class. Marking ahead, by a large allocation
// here, would bring the first collection earlier; not done.
//
// A huge page that cannot be had (memory fragmented, a memory cgroup at
// its limit) is not an error: the kernel falls back to small pages, and
// so does this package, silently.
//
// cmd/pulse-runtime (the namespace init) does not import it: its package initialisers
// allocate a few KiB, its heap stays in the first 2 MiB, and the collapse
// (0.5-2 ms) then costs what it saves (a namespace `true` took 51.9 ms
// with it, 51.4 ms without).
//
// PULSE_HUGEPAGES=0 in the environment turns it off (to compare, or where
// resident memory matters more than start-up time).
package hugeheap

// Env is the environment variable that turns the package off when "0".
const Env = "PULSE_HUGEPAGES"

// applied is whether the init marked the heap (false where it was turned
// off, on systems without transparent huge pages, or where the kernel
// refused); the tests read it.
var applied bool
