package boxrt

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkTreeManifest: the manifest of a 1,100-entry tree (100
// directories of 10 small files), the walk and hash every command's
// capture and every base manifest does, against the same tree listed and
// hashed by find and md5sum (what the runtime's shell predecessor ran).
func BenchmarkTreeManifest(b *testing.B) {
	dir := b.TempDir()
	for d := range 100 {
		for f := range 10 {
			p := filepath.Join(dir, fmt.Sprintf("d%02d/f%d.txt", d, f))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	ref := func() {
		c := exec.Command("sh", "-c", `find . -print >/dev/null && find . -type f -exec md5sum {} + >/dev/null`)
		c.Dir = dir
		if out, err := c.CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
	var mine, theirs time.Duration
	for b.Loop() {
		t0 := time.Now()
		m, err := treeManifest(dir, true)
		if err != nil || len(m.names) != 1100 {
			b.Fatalf("%v: %d names", err, len(m.names))
		}
		t1 := time.Now()
		ref()
		mine += t1.Sub(t0)
		theirs += time.Since(t1)
	}
	b.ReportMetric(float64(mine)/float64(b.N), "ns-manifest/op")
	b.ReportMetric(float64(mine)/float64(theirs), "x-vs-find-md5sum")
}
