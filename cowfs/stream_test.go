package cowfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// patternReader yields n pseudo-random bytes without holding them, and
// hashes what it gave.
type patternReader struct {
	n   int64
	rng *rand.ChaCha8
	h   interface{ Write([]byte) (int, error) }
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	r.rng.Read(p)
	r.h.Write(p)
	r.n -= int64(len(p))
	return len(p), nil
}

// TestStageStreamed stages a 48 MiB file from a reader that never holds
// it: the staged blob and the committed file hash-match what was read,
// and the bytes allocated while staging stay far below the file's size.
func TestStageStreamed(t *testing.T) {
	const size = 48 << 20
	ws := newWS(t)
	f := openFS(t, ws, WithMaxFileBytes(1<<30), WithMaxStagedBytes(1<<30))
	tx, err := f.Begin(t.Context(), "stream")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	src := &patternReader{n: size, rng: rand.NewChaCha8([32]byte{7}), h: h}
	open := func() (io.ReadCloser, error) { return io.NopCloser(src), nil }
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	errs, err := tx.Stage(context.Background(), []Op{StreamOp("big/file", open, 0o640), WriteOp("small", []byte("s"), 0)})
	runtime.ReadMemStats(&after)
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatal(errs, err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Errorf("staging %d streamed bytes allocated %d bytes", size, grew)
	}
	want := hex.EncodeToString(h.Sum(nil))
	var found bool
	for _, c := range tx.Changes() {
		if c.Path == "big/file" {
			found = true
			if c.Size != size {
				t.Errorf("staged size %d, want %d", c.Size, size)
			}
		}
	}
	if !found {
		t.Fatalf("big/file not staged: %+v", tx.Changes())
	}
	blob := filepath.Join(ws, ".pulse/cow/tx", tx.ID(), "blobs", want)
	if _, err := os.Stat(blob); err != nil {
		t.Fatalf("streamed bytes not in blobs/<sha256>: %v", err)
	}
	tmps, _ := filepath.Glob(filepath.Join(ws, ".pulse/cow/tx", tx.ID(), "blobs", ".tmp-*"))
	if len(tmps) != 0 {
		t.Fatalf("temps left: %v", tmps)
	}
	// A fresh FS sees it (durable, named by the stage log).
	tx2, err := openFS(t, ws).Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx2.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	fl, err := os.Open(filepath.Join(ws, "big/file"))
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	g := sha256.New()
	if _, err := io.Copy(g, fl); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(g.Sum(nil)); got != want {
		t.Fatalf("committed file hashes %s, want %s", got, want)
	}
	if fi, _ := fl.Stat(); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640", fi.Mode())
	}
}

var errSource = errors.New("source broke")

type failingReader struct{ left int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, errSource
	}
	n := min(len(p), r.left)
	r.left -= n
	return n, nil
}

// TestStageStreamedRefusals: a source that cannot be opened or read, or
// is over the file size limit, fails its op alone and leaves no temp;
// Data and Open together are refused.
func TestStageStreamedRefusals(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws, WithMaxFileBytes(1000))
	tx, err := f.Begin(t.Context(), "refusals")
	if err != nil {
		t.Fatal(err)
	}
	ops := []Op{
		StreamOp("noopen", func() (io.ReadCloser, error) { return nil, errSource }, 0),
		StreamOp("broken", func() (io.ReadCloser, error) { return io.NopCloser(&failingReader{left: 500}), nil }, 0),
		StreamOp("huge", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(make([]byte, 1001))), nil }, 0),
		{Kind: KindWrite, Path: "both", Data: []byte("x"), Open: func() (io.ReadCloser, error) { return nil, nil }},
		StreamOp("ok", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader([]byte("fine"))), nil }, 0),
	}
	errs, err := tx.Stage(context.Background(), ops)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[0], errSource) || !errors.Is(errs[1], errSource) {
		t.Errorf("source errors: %v, %v", errs[0], errs[1])
	}
	var le *LimitError
	if !errors.As(errs[2], &le) || le.Name != LimitFileBytes {
		t.Errorf("over the limit: %v", errs[2])
	}
	if errs[3] == nil || errs[4] != nil {
		t.Errorf("both: %v; ok: %v", errs[3], errs[4])
	}
	if n := len(tx.Changes()); n != 1 {
		t.Fatalf("%d changes, want 1: %+v", n, tx.Changes())
	}
	tmps, _ := filepath.Glob(filepath.Join(ws, ".pulse/cow/tx", tx.ID(), "blobs", ".tmp-*"))
	if len(tmps) != 0 {
		t.Fatalf("temps left: %v", tmps)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "ok")); string(b) != "fine" {
		t.Fatalf("ok = %q", b)
	}
}
