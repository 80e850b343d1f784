package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestLargeWriteIsStagedInBoundedMemory: a command on the namespace
// backend writes a 256 MiB file; Execute stages and commits it, the
// committed bytes hash-match what the command wrote, and the Go heap
// allocated during Execute stays far below the file's size (the backend
// hands the file by path and cowfs stages it from disk through a fixed
// buffer, instead of both holding it whole).
func TestLargeWriteIsStagedInBoundedMemory(t *testing.T) {
	const size = 256 << 20
	ws, state := t.TempDir(), t.TempDir()
	nb, err := namespace.New(namespace.WithStateDir(state))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Close() })
	testenv.MustHaveNamespace(t, nb.Probe)
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackend(nb), WithAutoCommit(),
		withCOWOptions(cowfs.WithMaxFileBytes(1<<30), cowfs.WithMaxStagedBytes(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := sb.Execute(context.Background(), Command{Shell: "head -c 268435456 /dev/urandom > big && sha256sum big"})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.CommitErr != nil || len(res.Refused) != 0 {
		t.Fatalf("exit %d, commit %v, refused %v, stderr %q", res.ExitCode, res.CommitErr, res.Refused, res.Stderr)
	}
	want, _, _ := strings.Cut(res.Stdout, " ")
	f, err := os.Open(filepath.Join(ws, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != size || got != want {
		t.Fatalf("committed %d bytes hashing %s; the command wrote %d hashing %s", n, got, size, want)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("Execute allocated %d MiB for a %d MiB file", grew>>20, size>>20)
	}
	// The backend's kept copy is gone once Execute returns (the run
	// directory itself goes in the background, without the file).
	filepath.WalkDir(state, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil && fi.Size() == size {
				t.Errorf("kept overlay file %s was not released", p)
			}
		}
		return nil
	})
}
