//go:build unix

package pathguard

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// swapper keeps replacing target with a symlink to outside and back, as
// an attacker inside the workspace would, until stop is closed. It counts
// the rounds in which the symlink was in place.
func swapper(target, outside string, stop <-chan struct{}, swaps *atomic.Int64) {
	aside := target + ".aside"
	for {
		select {
		case <-stop:
			return
		default:
		}
		// A writer under test may recreate target (WriteFile makes the
		// parents it needs) while the real directory is aside. Put the
		// real one back first: with a second, non-empty directory at
		// target, neither rename nor Remove could ever succeed again and
		// the swapper would spin without one swap.
		if _, err := os.Lstat(aside); err == nil {
			_ = os.RemoveAll(target) // a recreated copy or a symlink, never outside
			_ = os.Rename(aside, target)
		}
		if os.Rename(target, aside) != nil {
			_ = os.Remove(target)
			continue
		}
		if os.Symlink(outside, target) == nil {
			swaps.Add(1)
		}
		_ = os.Remove(target)
		_ = os.Rename(aside, target)
	}
}

// TestSymlinkSwapRace swaps a directory (and, separately, a file) for a
// symlink leading out while ReadFile runs in a loop: no read may ever
// return the outside content. The loop is bounded by a count of reads,
// not by time.
func TestSymlinkSwapRace(t *testing.T) {
	cases := []struct {
		name   string
		read   string // path given to ReadFile
		target string // path, relative to the root, that is swapped
		out    func(outside string) string
	}{
		{"intermediate directory", "d/f", "d", func(o string) string { return o }},
		{"last element", "f", "f", func(o string) string { return filepath.Join(o, "f") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top := t.TempDir()
			root, outside := filepath.Join(top, "root"), filepath.Join(top, "outside")
			for _, d := range []string{filepath.Join(root, "d"), outside} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write(t, filepath.Join(root, "d", "f"), "inside")
			write(t, filepath.Join(root, "f"), "inside")
			write(t, filepath.Join(outside, "f"), "SECRET")
			g := newGuard(t, root)

			stop := make(chan struct{})
			var swaps atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				swapper(filepath.Join(root, tc.target), tc.out(outside), stop, &swaps)
			}()
			reads, refusals := 0, 0
			kinds := map[string]int{}
			// At least 3,000 reads, and on until the swapper has swapped
			// a few times (bounded): with one P (a CPU-limited container)
			// the reads could otherwise all run before it is scheduled.
			for i := 0; i < 3000 || swaps.Load() < 10 && i < 300000; i++ {
				if i%64 == 0 {
					runtime.Gosched()
				}
				data, err := g.ReadFile(tc.read)
				if strings.Contains(string(data), "SECRET") {
					close(stop)
					wg.Wait()
					t.Fatalf("read outside the root on iteration %d", i)
				}
				if err == nil {
					reads++
					if string(data) != "inside" {
						t.Errorf("read %q", data)
					}
				} else {
					refusals++
					kinds[errKind(err)]++
					// A directory swapped for a symlink mid-walk is refused
					// as one, or found not to be a directory any more.
					if !errors.Is(err, ErrOutside) && !errors.Is(err, ErrNotRegular) && !errors.Is(err, os.ErrNotExist) &&
						!errors.Is(err, syscall.ENOTDIR) {
						t.Errorf("unexpected error: %v", err)
					}
				}
			}
			close(stop)
			wg.Wait()
			t.Logf("%d reads, %d refusals %v, %d swaps", reads, refusals, kinds, swaps.Load())
			if swaps.Load() == 0 {
				t.Error("the swapper never ran; the test proved nothing")
			}
		})
	}
}

// noFollowDirFollows reports whether this kernel opens a directory
// through a symlink despite O_NOFOLLOW|O_DIRECTORY, which must fail
// (ENOTDIR, or ELOOP). gVisor's (runsc, as scripts/testenv.sh installs
// it) does: WriteFile's parent walk is os.Root's, whose guarantee rests
// on that refusal, so under such a kernel a swapped parent leads it out.
// Pulse runs pathguard on the host's kernel, never in a gVisor box; a
// test binary run in one (the agent battery runs this package's tests in
// every backend) says so instead of failing.
func noFollowDirFollows(t *testing.T) bool {
	top := t.TempDir()
	if err := os.Mkdir(filepath.Join(top, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("dir", filepath.Join(top, "link")); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(filepath.Join(top, "link"), syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	syscall.Close(fd)
	return true
}

// TestWriteSwapRace swaps the parent directory for a symlink leading out
// while WriteFile runs: nothing may ever be written outside.
func TestWriteSwapRace(t *testing.T) {
	if noFollowDirFollows(t) {
		t.Skip("this kernel opens a directory through a symlink despite O_NOFOLLOW|O_DIRECTORY (gVisor's does), " +
			"which os.Root, and so WriteFile, relies on; pulse runs pathguard on the host's kernel")
	}
	top := t.TempDir()
	root, outside := filepath.Join(top, "root"), filepath.Join(top, "outside")
	for _, d := range []string{filepath.Join(root, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g := newGuard(t, root)
	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		swapper(filepath.Join(root, "d"), outside, stop, &swaps)
	}()
	// At least 200 writes, and on until the swapper has swapped a few
	// times (bounded), as in TestSymlinkSwapRace: on a busy machine the
	// writes could otherwise all run before it is scheduled (CI's battery
	// saw "the swapper never ran" once).
	for i := 0; i < 200 || swaps.Load() < 10 && i < 20000; i++ {
		if i%16 == 0 {
			runtime.Gosched()
		}
		_ = g.WriteFile("d/w", []byte("x"), 0o644)
	}
	close(stop)
	wg.Wait()
	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("written outside the root: %v", entries)
	}
	if swaps.Load() == 0 {
		t.Error("the swapper never ran; the test proved nothing")
	}
}

func errKind(err error) string {
	var pe *PathError
	if errors.As(err, &pe) {
		return pe.Reason
	}
	return "other"
}
