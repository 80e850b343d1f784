package namespace

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// hostBytes is the size of the regular files under dir on the host.
func hostBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// watchHost records the most bytes the files under dir held while the
// returned stop has not been called.
func watchHost(dir string) (stop func() int64) {
	var most atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if n := hostBytes(dir); n > most.Load() {
				most.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() int64 { close(done); wg.Wait(); return most.Load() }
}

// TestDiskBoundEndsACommandAndKeepsItsWrites: a command that writes past
// limits.disk_bytes is refused by the kernel at the bound and ended with
// termination reason disk_limit, what it wrote before (and up to the
// bound) is in its overlay, and the host's disk under the state dir never
// held more than the bound (the writes went to the size-limited scratch,
// not the host's temporary directory).
func TestDiskBoundEndsACommandAndKeepsItsWrites(t *testing.T) {
	const bound = 8 << 20
	state := filepath.Join(t.TempDir(), "state")
	b := newBackend(t, WithStateDir(state))
	stop := watchHost(state)
	res, _, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		Shell:  "echo kept > a.txt; mkdir d; echo also > d/b.txt; head -c 64M /dev/zero > big; sleep 20",
		Limits: policy.ResourceLimits{DiskBytes: bound, Timeout: 10 * time.Second}})
	most := stop()
	if res.Termination != backend.DiskLimit {
		t.Fatalf("termination %q (exit %d), want %q", res.Termination, res.ExitCode, backend.DiskLimit)
	}
	if most > bound {
		t.Errorf("the host held %d bytes under the state dir while the command ran, past the bound %d", most, bound)
	}
	files := map[string]int{}
	for _, f := range res.Overlay.Files {
		files[f.Path] = len(f.Data)
	}
	if files["a.txt"] != 5 || files["d/b.txt"] != 5 {
		t.Fatalf("writes before the bound lost: %v", files)
	}
	if n, ok := files["big"]; !ok || n == 0 || n > bound {
		t.Fatalf("the file that reached the bound: %d bytes (kept %v), want 1..%d", n, ok, bound)
	}
}

// TestDiskBoundCountsFiles: empty files take no space but an inode each;
// the scratch's inodes bound them too.
func TestDiskBoundCountsFiles(t *testing.T) {
	b := newBackend(t)
	res, _, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		Shell:  "mkdir d; i=0; while [ $i -lt 5000 ]; do : > d/f$i || break; i=$((i+1)); done; sleep 20",
		Limits: policy.ResourceLimits{DiskBytes: 1 << 20, Timeout: 10 * time.Second}})
	if res.Termination != backend.DiskLimit {
		t.Fatalf("termination %q (exit %d), want %q", res.Termination, res.ExitCode, backend.DiskLimit)
	}
	if n := len(res.Overlay.Files); n < 100 || n > int(scratchInodes(1<<20)) {
		t.Fatalf("%d entries kept, want most of the %d the scratch holds", n, scratchInodes(1<<20))
	}
}

// TestDiskDefaultIsBounded: with no disk_bytes the scratch is bounded
// anyway, by policy.DiskDefault of the memory available.
func TestDiskDefaultIsBounded(t *testing.T) {
	if n := scratchBytes(policy.ResourceLimits{}); n <= 0 || n > policy.DefaultDiskBytes {
		t.Fatalf("default scratch %d bytes, want 1..%d", n, policy.DefaultDiskBytes)
	}
	if n := scratchBytes(policy.ResourceLimits{DiskBytes: 3 << 30}); n != 3<<30 {
		t.Fatalf("scratch for disk_bytes 3GiB: %d", n)
	}
	// No more than the backend reads back: past it every write would be
	// lost.
	if n := scratchBytes(policy.ResourceLimits{DiskBytes: 64 << 30}); n != maxOverlayTotal {
		t.Fatalf("scratch for disk_bytes 64GiB: %d, want %d", n, maxOverlayTotal)
	}
	// What the command sees: the workspace's filesystem has the bound's
	// size.
	b := newBackend(t)
	_, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: "df -k . | tail -1",
		Limits: policy.ResourceLimits{DiskBytes: 64 << 20}})
	f := strings.Fields(out)
	if len(f) < 2 || f[1] != strconv.Itoa(64<<10) {
		t.Fatalf("df of the workspace in the sandbox: %q, want %d KiB in all", out, 64<<10)
	}
}

// TestWithoutScratchWritesStillCaptured: on a kernel whose tmpfs cannot
// be the upper layer (before Linux 6.6; forced here) the upper directory
// stays in the run directory, writes are captured as before, and the
// backend does not claim the disk bound, so a policy that sets it is
// refused rather than unenforced.
func TestWithoutScratchWritesStillCaptured(t *testing.T) {
	b := newBackend(t)
	b.scratch = false
	if _, ok := b.Capabilities().Limits[policy.LimitDiskBytes]; ok {
		t.Fatal("disk_bytes listed as enforced without a scratch")
	}
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "d", "old"), "x")
	res, _, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: "echo new > a.txt; rm -r d; mkdir d; echo y > d/n", StreamFiles: true})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	defer res.Overlay.Release()
	got := map[string]bool{}
	for _, f := range res.Overlay.Files {
		got[f.Path] = true
	}
	if !got["a.txt"] || !got["d/n"] || len(res.Overlay.Deleted) != 1 || res.Overlay.Deleted[0] != "d/old" {
		t.Fatalf("overlay %+v", res.Overlay)
	}
}

// TestScratchKeepsOpaqueDirectories: a directory removed and made again
// is opaque in the tmpfs upper layer too (user.overlay.opaque, which
// tmpfs stores since Linux 6.6): the old entries read as deleted.
func TestScratchKeepsOpaqueDirectories(t *testing.T) {
	b := newBackend(t)
	if !b.scratch {
		t.Skip("this kernel's tmpfs cannot be the upper layer (before Linux 6.6)")
	}
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "d", "old"), "x")
	res, _, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: "rm -r d && mkdir d && echo y > d/n"})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	var made bool
	for _, f := range res.Overlay.Files {
		made = made || f.Path == "d/n"
	}
	if !made || len(res.Overlay.Deleted) != 1 || res.Overlay.Deleted[0] != "d/old" {
		t.Fatalf("overlay %+v", res.Overlay)
	}
	if res.Metrics.DiskBytes <= 0 {
		t.Errorf("Metrics.DiskBytes %d, want what the tmpfs held", res.Metrics.DiskBytes)
	}
}

func TestKernelVersion(t *testing.T) {
	for _, c := range []struct {
		in           string
		major, minor int
		ok           bool
	}{
		{"6.18.44-fc-v1300", 6, 18, true},
		{"6.6", 6, 6, true},
		{"5.15.0-91-generic", 5, 15, true},
		{"6.1.0-rc1", 6, 1, true},
		{"bogus", 0, 0, false},
	} {
		major, minor, ok := kernelVersion(c.in)
		if ok != c.ok || ok && (major != c.major || minor != c.minor) {
			t.Errorf("kernelVersion(%q) = %d, %d, %v", c.in, major, minor, ok)
		}
	}
}

// scratchFDs counts this process's descriptors on a tmpfs of exactly
// size bytes: a command's scratch, held open.
func scratchFDs(t *testing.T, size int64) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Statfs_t
		if unix.Fstatfs(fd, &st) == nil && st.Type == unix.TMPFS_MAGIC && int64(st.Blocks)*st.Bsize == size {
			n++
		}
	}
	return n
}

// TestScratchIsFreed: a command's scratch is held only until its overlay
// is read, or, with files handed by path (StreamFiles), until the
// overlay is released; then its memory is free.
func TestScratchIsFreed(t *testing.T) {
	const size = 3<<20 + 7*4096 // a size no other tmpfs here has
	b := newBackend(t)
	if !b.scratch {
		t.Skip("this kernel's tmpfs cannot be the upper layer (before Linux 6.6)")
	}
	req := func(stream bool) *backend.Request {
		return &backend.Request{Workspace: t.TempDir(), Shell: "head -c 2M /dev/zero > big; echo s > small", StreamFiles: stream,
			Limits: policy.ResourceLimits{DiskBytes: size}}
	}
	res, _, _ := runCmd(t, b, req(false))
	if len(res.Overlay.Files) != 2 {
		t.Fatalf("overlay %+v", res.Overlay)
	}
	if n := scratchFDs(t, size); n != 0 {
		t.Fatalf("%d descriptors of the scratch left open after the overlay was read", n)
	}
	res, _, _ = runCmd(t, b, req(true))
	var src string
	for _, f := range res.Overlay.Files {
		if f.Path == "big" {
			src = f.Source
		}
	}
	if src == "" {
		t.Fatalf("the 2 MiB file was not handed by path: %+v", res.Overlay)
	}
	if n := scratchFDs(t, size); n != 1 {
		t.Fatalf("%d descriptors of the scratch open while its files are handed by path, want 1", n)
	}
	if data, err := os.ReadFile(src); err != nil || len(data) != 2<<20 {
		t.Fatalf("reading the kept file: %d bytes, %v", len(data), err)
	}
	if err := res.Overlay.Release(); err != nil {
		t.Fatal(err)
	}
	if n := scratchFDs(t, size); n != 0 {
		t.Fatalf("%d descriptors of the scratch left open after Release", n)
	}
}

// TestMaxScratchWithinWhatIsReadBack: a scratch larger than what the
// backend reads back would let a command write past the point where all
// its writes are lost.
func TestMaxScratchWithinWhatIsReadBack(t *testing.T) {
	if maxScratch > maxOverlayTotal {
		t.Fatalf("maxScratch %d is over maxOverlayTotal %d", maxScratch, maxOverlayTotal)
	}
	if got := scratchBytes(policy.ResourceLimits{DiskBytes: 1 << 40}); got != maxScratch {
		t.Errorf("scratchBytes of 1 TiB = %d, want the cap %d", got, maxScratch)
	}
}
