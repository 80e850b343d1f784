//go:build unix

package pathguard

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchRatio runs ours and ref b.N times each and reports ours/ref, so the
// cost of the guard is read against the plain call on the same machine in
// the same run.
func benchRatio(b *testing.B, ref string, ours, plain func() error) {
	b.Helper()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := ours(); err != nil {
			b.Fatal(err)
		}
	}
	oursT := time.Since(start)
	b.StopTimer()
	start = time.Now()
	for range b.N {
		if err := plain(); err != nil {
			b.Fatal(err)
		}
	}
	refT := time.Since(start)
	if refT > 0 {
		b.ReportMetric(float64(oursT)/float64(refT), "x-vs-"+ref)
	}
}

func benchWorkspace(b *testing.B) (*Guard, string) {
	b.Helper()
	root := b.TempDir()
	dir := filepath.Join(root, "src", "pkg", "sub")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file.go"), make([]byte, 4096), 0o644); err != nil {
		b.Fatal(err)
	}
	g, err := New(root)
	if err != nil {
		b.Fatal(err)
	}
	return g, "src/pkg/sub/file.go"
}

func BenchmarkReadFile(b *testing.B) {
	g, rel := benchWorkspace(b)
	abs := filepath.Join(g.Root(), rel)
	benchRatio(b, "os.ReadFile",
		func() error { _, err := g.ReadFile(rel); return err },
		func() error { _, err := os.ReadFile(abs); return err })
}

func BenchmarkResolve(b *testing.B) {
	g, rel := benchWorkspace(b)
	abs := filepath.Join(g.Root(), rel)
	benchRatio(b, "EvalSymlinks",
		func() error { _, err := g.Resolve(rel); return err },
		func() error { _, err := filepath.EvalSymlinks(abs); return err })
}

func BenchmarkWriteFile(b *testing.B) {
	g, rel := benchWorkspace(b)
	abs := filepath.Join(g.Root(), rel)
	data := make([]byte, 4096)
	// The reference is the same atomic sequence without the guard:
	// temp file, write, fsync, rename, fsync of the directory.
	benchRatio(b, "plain-atomic-write",
		func() error { return g.WriteFile(rel, data, 0o644) },
		func() error {
			tmp := abs + ".tmp"
			f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			if _, err := f.Write(data); err != nil {
				return err
			}
			if err := f.Sync(); err != nil {
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp, abs); err != nil {
				return err
			}
			d, err := os.Open(filepath.Dir(abs))
			if err != nil {
				return err
			}
			defer d.Close()
			return d.Sync()
		})
}
