package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
)

// setWatchTiming sets the watcher's polling for one test.
func setWatchTiming(t *testing.T, safety time.Duration, noInotify bool) {
	t.Helper()
	oldSafety, oldNo := watchSafetyInterval, watchNoInotify
	watchSafetyInterval, watchNoInotify = safety, noInotify
	t.Cleanup(func() { watchSafetyInterval, watchNoInotify = oldSafety, oldNo })
}

// waitEvents reads events until every path of want was seen with its
// op, last; it fails after a minute.
func waitEvents(t *testing.T, events <-chan FileEvent, want map[string]FileOp) {
	t.Helper()
	got := map[string]FileOp{}
	timeout := time.After(time.Minute)
	for {
		done := true
		for p, op := range want {
			if got[p] != op {
				done = false
			}
		}
		if done {
			return
		}
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the watch ended; events so far %v, want %v", got, want)
			}
			got[ev.Path] = ev.Op
		case <-timeout:
			t.Fatalf("events so far %v, want %v", got, want)
		}
	}
}

// TestWatchInotify: with the safety poll out of reach (an hour), events
// still come: inotify on the pending stack wakes the watcher for a
// command's writes, for WriteFile, and for a transaction another FS of
// the same workspace (what another process would use) stages; inotify on
// the workspace reports edits made beside Pulse, for paths the stack
// does not decide.
func TestWatchInotify(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	setWatchTiming(t, time.Hour, false)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "old.txt"), []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := newIsolated(t, ws)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := sb.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Execute(ctx, Command{Shell: "echo made > made.txt"}); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"made.txt": FileCreated})
	if _, err := sb.WriteFile(ctx, "api.txt", []byte("api\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"api.txt": FileCreated})

	other := newIsolated(t, ws)
	if _, err := other.WriteFile(ctx, "other.txt", []byte("other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"other.txt": FileCreated})

	// Beside Pulse: a new file and directory, an edit, a removal.
	if err := os.MkdirAll(filepath.Join(ws, "ext", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "ext", "sub", "f.txt"), []byte("f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"ext": FileCreated, "ext/sub/f.txt": FileCreated})
	if err := os.WriteFile(filepath.Join(ws, "old.txt"), []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"old.txt": FileChanged})
	if err := os.Remove(filepath.Join(ws, "ext", "sub", "f.txt")); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"ext/sub/f.txt": FileRemoved})
	// A path the stack decides: the workspace's edit is not the view's.
	if err := os.WriteFile(filepath.Join(ws, "made.txt"), []byte("beside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "marker.txt"), []byte("m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case ev := <-events:
			if ev.Path == "made.txt" {
				t.Fatalf("an edit hidden by the pending stack was reported: %v", ev)
			}
			if ev.Path != "marker.txt" {
				continue
			}
		case <-time.After(time.Minute):
			t.Fatal("no event for marker.txt")
		}
		break
	}
}

// TestWatchPolling: where inotify cannot be had, the watcher polls every
// WatchInterval and still reports what lands on the pending stack.
func TestWatchPolling(t *testing.T) {
	setWatchTiming(t, time.Hour, true)
	sb := newIsolated(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := sb.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Execute(ctx, Command{Shell: "echo made > made.txt"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.WriteFile(ctx, "api.txt", []byte("api\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"made.txt": FileCreated, "api.txt": FileCreated})
	if _, err := sb.DiscardAll(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, events, map[string]FileOp{"made.txt": FileSettled, "api.txt": FileSettled})
}

// TestWatchHostWrites: on a backend that writes the workspace in place
// (host), what a command writes is reported through the workspace's
// inotify watches; policy-denied paths are not.
func TestWatchHostWrites(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	setWatchTiming(t, time.Hour, false)
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{{Action: policy.Read, Target: "a-secret.txt", Decision: policy.Deny}}, pol.Rules...)
	sb := newHost(t, t.TempDir(), WithPolicy(pol))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := sb.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Execute(ctx, Command{Shell: "echo s > a-secret.txt; mkdir -p d; echo x > d/x.txt"}); err != nil {
		t.Fatal(err)
	}
	got := map[string]FileOp{}
	timeout := time.After(time.Minute)
	for got["d/x.txt"] != FileCreated {
		select {
		case ev := <-events:
			if ev.Path == "a-secret.txt" {
				t.Fatalf("an event for a path the policy denies reading: %v", ev)
			}
			got[ev.Path] = ev.Op
		case <-timeout:
			t.Fatalf("events so far %v", got)
		}
	}
	if got["d"] != FileCreated {
		t.Errorf("events %v, want d created too", got)
	}
}
