package cowfs

import (
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkDiffVsGit times Tx.Diff of one 20,000-line file with 200
// edits (the lock, the stage log and both files read included) against
// `git diff --no-index --histogram` run as a process on the same two
// files, in the same run: x-vs-git is the time ratio, size-vs-git the
// ratio of the hunks' bytes.
func BenchmarkDiffVsGit(b *testing.B) {
	git, err := exec.LookPath("git")
	if err != nil {
		b.Skip("needs git to compare with: not in PATH")
	}
	inputs := []struct {
		name string
		gen  func(r *rand.Rand) (string, string)
	}{
		{"repetitive", func(r *rand.Rand) (string, string) { return repetitiveInput(r, 20000, 200) }},
		{"scattered", func(r *rand.Rand) (string, string) { return scatteredInput(r, 20000, 200) }},
		{"ordinary", func(r *rand.Rand) (string, string) { return ordinaryInput(b, r, 20000, 200) }},
	}
	for _, in := range inputs {
		b.Run(in.name, func(b *testing.B) {
			old, nw := in.gen(rand.New(rand.NewSource(2)))
			ws, dir := b.TempDir(), b.TempDir()
			for _, w := range []struct{ path, data string }{
				{filepath.Join(ws, "big.txt"), old},
				{filepath.Join(dir, "old.txt"), old},
				{filepath.Join(dir, "new.txt"), nw},
			} {
				if err := os.WriteFile(w.path, []byte(w.data), 0o644); err != nil {
					b.Fatal(err)
				}
			}
			f, err := Open(b.Context(), ws)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			tx, err := f.Begin(b.Context(), "bench")
			if err != nil {
				b.Fatal(err)
			}
			if err := tx.Write(b.Context(), "big.txt", []byte(nw), 0); err != nil {
				b.Fatal(err)
			}
			var cow, ref time.Duration
			var cowSize, gitSize int
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				d, err := tx.Diff(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				cow += time.Since(start)
				b.StopTimer()
				start = time.Now()
				out := gitDiff(b, git, filepath.Join(dir, "old.txt"), filepath.Join(dir, "new.txt"))
				ref += time.Since(start)
				cowSize, _ = hunkBody([]byte(d))
				gitSize, _ = hunkBody(out)
				b.StartTimer()
			}
			b.ReportMetric(float64(cow)/float64(ref), "x-vs-git")
			b.ReportMetric(float64(cowSize)/float64(gitSize), "size-vs-git")
		})
	}
}
