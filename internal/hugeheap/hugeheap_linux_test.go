//go:build linux && (amd64 || arm64)

package hugeheap

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// vmFlags returns the VmFlags of the mapping of this process that holds
// addr, from /proc/self/smaps.
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := mappingRange(line); ok {
			in = lo <= addr && addr < hi
			continue
		}
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok && in {
			return strings.Fields(rest)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("no mapping holds %#x", addr)
	return nil
}

// mappingRange parses a mapping's first smaps line ("lo-hi perms ...").
func mappingRange(line string) (lo, hi uintptr, ok bool) {
	r, _, found := strings.Cut(line, " ")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(r, "-")
	if !found {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(a, 16, 64)
	h, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(l), uintptr(h), true
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if x == f {
			return true
		}
	}
	return false
}

func needTHP(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		t.Skipf("this kernel has no transparent huge pages: %v", err)
	}
	if strings.Contains(string(b), "[never]") {
		t.Skip("transparent huge pages are turned off on this machine (never)")
	}
}

// TestHeapMarked: the init, which ran in this test binary, marked the
// mapping of the heap (VmFlags "hg", VM_HUGEPAGE) it found.
//
// Where a fresh heap object made now lies is only reported: since Go
// 1.26 the heap starts at a random offset in its arena, and memory the
// runtime maps after the init (a mapping of its own, made over its
// reservation with MAP_FIXED) is in about one run in ten a mapping the
// init never saw, without the flag. The package then saves less, not
// nothing (see the package comment).
func TestHeapMarked(t *testing.T) {
	needTHP(t)
	if os.Getenv(Env) == "0" {
		t.Skipf("%s=0 in this test's environment", Env)
	}
	if !applied {
		t.Fatal("applied is false: the init did not mark the heap")
	}
	if f := vmFlags(t, uintptr(unsafe.Pointer(probe))); !hasFlag(f, "hg") {
		t.Fatalf("the heap's mapping has VmFlags %v, no hg", f)
	}
	later := make([]byte, 1<<20)
	if f := vmFlags(t, uintptr(unsafe.Pointer(&later[0]))); !hasFlag(f, "hg") {
		t.Logf("a later allocation lies in a mapping made after the init (VmFlags %v, no hg)", f)
	}
}

// TestTurnedOff re-runs this test binary with PULSE_HUGEPAGES=0: the init
// then leaves the heap as the runtime made it.
func TestTurnedOff(t *testing.T) {
	needTHP(t)
	if os.Getenv("HUGEHEAP_CHILD") == "1" {
		flags := vmFlags(t, uintptr(unsafe.Pointer(new([1 << 16]byte))))
		fmt.Printf("applied=%v hg=%v\n", applied, hasFlag(flags, "hg"))
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTurnedOff$", "-test.v")
	cmd.Env = append(os.Environ(), "HUGEHEAP_CHILD=1", Env+"=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "applied=false hg=false") {
		t.Fatalf("with %s=0 the heap was still marked:\n%s", Env, out)
	}
}

func TestMappingRange(t *testing.T) {
	lo, hi, ok := mappingRange("7f00c0000000-7f00c4000000 rw-p 00000000 00:00 0 ")
	if !ok || lo != 0x7f00c0000000 || hi != 0x7f00c4000000 {
		t.Fatalf("got %#x %#x %v", lo, hi, ok)
	}
	for _, bad := range []string{"Rss:  4 kB", "VmFlags: rd wr", "zz-10 r"} {
		if _, _, ok := mappingRange(bad); ok {
			t.Errorf("%q parsed as a mapping", bad)
		}
	}
}
