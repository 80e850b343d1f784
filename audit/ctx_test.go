package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/internal/flock"
)

// TestOpenAndVerifyHonourContext: Open and Verify wait for the append lock
// only as long as their ctx lives, and Verify gives ctx's error, not a
// verdict, when ctx has ended even though the lock was free.
func TestOpenAndVerifyHonourContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 2)
	done, cancel := context.WithCancel(t.Context())
	cancel()

	if _, err := Verify(done, path); !errors.Is(err, context.Canceled) {
		t.Fatalf("Verify(cancelled ctx), lock free = %v, want context.Canceled", err)
	}

	// Another holder of the append lock (a second open description
	// contends like another process).
	holder, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := flock.Lock(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(done, path); !errors.Is(err, context.Canceled) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Open(cancelled ctx), lock held = %v, want context.Canceled", err)
	}
	if _, err := Verify(done, path); !errors.Is(err, context.Canceled) {
		t.Fatalf("Verify(cancelled ctx), lock held = %v, want context.Canceled", err)
	}
	if err := flock.Unlock(holder); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(t.Context(), path); err != nil || rep.LastSeq != 2 {
		t.Fatalf("Verify after release = %+v, %v", rep, err)
	}
}
