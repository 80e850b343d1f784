package namespace

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// waitFreeRuns waits until b keeps n emptied run directories for reuse,
// and returns them.
func waitFreeRuns(t *testing.T, b *Backend, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		var dirs []string
		for _, r := range b.freeRuns {
			dirs = append(dirs, r.dir)
		}
		b.mu.Unlock()
		if len(dirs) == n {
			return dirs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d run directories kept for reuse, want %d", len(dirs), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRunDirectoryIsReusedEmpty: the run directory of a finished command
// is emptied and used again by the next init, whose command finds none of
// the last one's writes (files, an unwritable directory, a deletion, a
// changed workspace root) in its overlay; Close removes it.
func TestRunDirectoryIsReusedEmpty(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	b := newBackend(t, WithStateDir(state), WithoutPrestart())
	probed := waitFreeRuns(t, b, 1) // the probe's
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "gone"), "old\n")
	res, _, errs := runCmd(t, b, &backend.Request{Workspace: ws,
		Shell: "mkdir -p d/e && echo hi > d/e/f && chmod 0500 d/e d && echo x > top && rm gone && chmod 0751 . && touch -d @0 ."})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, errs)
	}
	if res.Overlay.Empty() {
		t.Fatal("the first command's writes are not in its overlay")
	}
	res.Overlay.Release()
	if free := waitFreeRuns(t, b, 1); !slices.Equal(free, probed) {
		t.Fatalf("run directories %q after the first command, want the probe's %q reused", free, probed)
	}

	res, _, errs = runCmd(t, b, &backend.Request{Workspace: ws, Shell: "test -e gone && test ! -e top && test ! -e d && echo y > other"})
	if res.ExitCode != 0 {
		t.Fatalf("the second command saw the first one's writes: exit %d: %s", res.ExitCode, errs)
	}
	var paths []string
	for _, f := range res.Overlay.Files {
		paths = append(paths, f.Path)
	}
	if !slices.Equal(paths, []string{"other"}) || len(res.Overlay.Deleted) != 0 {
		t.Fatalf("second overlay: files %q, deleted %q; want only other", paths, res.Overlay.Deleted)
	}
	res.Overlay.Release()
	if again := waitFreeRuns(t, b, 1); !slices.Equal(again, probed) {
		t.Fatalf("run directories %q after the second command, want the first one's %q reused", again, probed)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(state); err != nil || len(ents) != 0 {
		t.Fatalf("run directories left after Close: %v (%v)", ents, err)
	}
}

// TestReconcileLeavesARunBeingMade: another backend's Reconcile on the
// same state dir, between the moment a new run's lock file exists and the
// moment it is held, leaves the run alone (the lock gets its name only
// once held), and the run's command runs.
func TestReconcileLeavesARunBeingMade(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	b := newBackend(t, WithStateDir(state), WithoutPrestart())
	other, err := New(WithStateDir(state))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// The probe's run, kept for reuse, is taken first: the run below is
	// made anew.
	waitFreeRuns(t, b, 1)
	kept, err := b.newRun()
	if err != nil {
		t.Fatal(err)
	}
	defer kept.remove()
	var made []string
	runLockHook = func(dir string) {
		made = append(made, dir)
		if err := other.Reconcile(context.Background()); err != nil {
			t.Error(err)
		}
	}
	defer func() { runLockHook = nil }()
	r, err := b.newRun()
	if err != nil {
		t.Fatalf("newRun with a Reconcile in its window: %v", err)
	}
	defer r.remove()
	if len(made) != 1 {
		t.Fatalf("the hook ran %d times, want 1", len(made))
	}
	for _, d := range append([]string{"lock"}, runSubdirs...) {
		if _, err := os.Stat(filepath.Join(r.dir, d)); err != nil {
			t.Fatalf("the run being made lost %s to another backend's Reconcile: %v", d, err)
		}
	}
}
