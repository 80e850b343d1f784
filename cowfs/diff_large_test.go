package cowfs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestDiffBoundedMemoryOnLargeFiles diffs a 256 MiB workspace file
// (sparse, so the test costs no disk) and text files over DiffMaxBytes:
// each is summarised by size and SHA-256, and the diff allocates a few
// MiB, not the files' size (it read both sides whole before: 3.1 GiB for
// a 1 GiB file).
func TestDiffBoundedMemoryOnLargeFiles(t *testing.T) {
	ws := newWS(t)
	const huge = 256 << 20
	fl, err := os.Create(filepath.Join(ws, "huge.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Truncate(huge); err != nil {
		t.Fatal(err)
	}
	fl.Close()
	var text strings.Builder
	for i := 0; text.Len() <= DiffMaxBytes; i++ {
		fmt.Fprintf(&text, "line %d of a large generated file\n", i)
	}
	big := text.String()
	writeFile(t, ws, "big.txt", big, 0o644)
	writeFile(t, ws, "gone.txt", big, 0o644)
	f := openFS(t, ws, WithMaxFileBytes(64<<20))
	tx, err := f.Begin(t.Context(), "large")
	if err != nil {
		t.Fatal(err)
	}
	bigNew := strings.Replace(big, "line 7 of", "line seven of", 1)
	for _, w := range []struct{ p, data string }{
		{"huge.bin", "small now\n"},
		{"big.txt", bigNew},
		{"new-big.txt", big},
	} {
		if err := tx.Write(t.Context(), w.p, []byte(w.data), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Delete(t.Context(), "gone.txt"); err != nil {
		t.Fatal(err)
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, err := tx.Diff(t.Context())
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("Diff allocated %d bytes", alloc)
	if alloc > 4<<20 {
		t.Errorf("Diff allocated %d bytes for files of %d and %d bytes", alloc, huge, len(big))
	}

	h := sha256.New()
	io.Copy(h, io.LimitReader(zeros{}, huge))
	hugeSHA := hex.EncodeToString(h.Sum(nil))
	n := fmt.Sprint(len(big))
	for _, want := range []string{
		"diff --git a/huge.bin b/huge.bin\nBinary files a/huge.bin and b/huge.bin differ\n" +
			"old: 268435456 bytes, sha256 " + hugeSHA + "\nnew: 10 bytes, sha256 " + sha256Hex([]byte("small now\n")) + "\n",
		"diff --git a/big.txt b/big.txt\nBinary files a/big.txt and b/big.txt differ\n" +
			"old: " + n + " bytes, sha256 " + sha256Hex([]byte(big)) + "\nnew: " + fmt.Sprint(len(bigNew)) + " bytes, sha256 " + sha256Hex([]byte(bigNew)) + "\n",
		"diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\nBinary files a/gone.txt and /dev/null differ\n" +
			"old: " + n + " bytes, sha256 " + sha256Hex([]byte(big)) + "\ndiff",
		"diff --git a/new-big.txt b/new-big.txt\nnew file mode 100644\nBinary files /dev/null and b/new-big.txt differ\n" +
			"new: " + n + " bytes, sha256 " + sha256Hex([]byte(big)) + "\n",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q\n--- diff:\n%s", want, d)
		}
	}
}

// A small binary file is summarised the same way, and a large file
// whose content is unchanged shows only its mode change.
func TestDiffSummarisesBinaryAndEqualLargeFiles(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "bin", "\x00\x01", 0o644)
	big := strings.Repeat("0123456789abcdef\n", DiffMaxBytes/17+1)
	writeFile(t, ws, "big", big, 0o644)
	f := openFS(t, ws, WithMaxFileBytes(64<<20))
	tx, _ := f.Begin(t.Context(), "summaries")
	if err := tx.Write(t.Context(), "bin", []byte("\x00\x02\x03"), 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), "big", []byte(big), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := tx.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := "diff --git a/big b/big\nold mode 100644\nnew mode 100755\n" +
		"diff --git a/bin b/bin\nBinary files a/bin and b/bin differ\n" +
		"old: 2 bytes, sha256 " + sha256Hex([]byte("\x00\x01")) + "\n" +
		"new: 3 bytes, sha256 " + sha256Hex([]byte("\x00\x02\x03")) + "\n"
	if d != want {
		t.Fatalf("diff = %q\nwant %q", d, want)
	}
}

// Once the diff passes diffMaxOutput, further files are summarised, so
// that a transaction of many large rewrites cannot exhaust memory.
func TestDiffSummarisesPastItsOutputBound(t *testing.T) {
	defer func(n int) { diffMaxOutput = n }(diffMaxOutput)
	diffMaxOutput = 10
	ws := newWS(t)
	writeFile(t, ws, "a.txt", "one\n", 0o644)
	writeFile(t, ws, "b.txt", "one\n", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "bound")
	tx.Write(t.Context(), "a.txt", []byte("two\n"), 0)
	tx.Write(t.Context(), "b.txt", []byte("two\n"), 0)
	d, err := tx.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d, "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+two\n") ||
		!strings.Contains(d, "diff --git a/b.txt b/b.txt\nBinary files a/b.txt and b/b.txt differ\n") {
		t.Fatalf("diff:\n%s", d)
	}
}

// Staged bytes that no longer match their recorded hash are not shown as
// if they were what a commit would write.
func TestDiffRefusesDamagedStagedBytes(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "a.txt", "one\n", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "damaged")
	if err := tx.Write(t.Context(), "a.txt", []byte("two\n"), 0); err != nil {
		t.Fatal(err)
	}
	blobs, err := filepath.Glob(filepath.Join(ws, ".pulse", "cow", "tx", "*", "blobs", "*"))
	if err != nil || len(blobs) != 1 {
		t.Fatalf("staged blobs: %v %v", blobs, err)
	}
	if err := os.WriteFile(blobs[0], []byte("twx\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := tx.Diff(t.Context())
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `"a.txt"`) {
		t.Fatalf("Diff of a damaged blob: %q, %v", d, err)
	}
}
