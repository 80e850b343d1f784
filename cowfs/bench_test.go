package cowfs

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkCommit1000Files commits 1,000 new 4 KiB files. The reference,
// timed in the same run, is the least any durable writer must do: write
// each file to a temp name, fsync, rename, then fsync the directory.
func BenchmarkCommit1000Files(b *testing.B) {
	data := make([]byte, 4096)
	rand.New(rand.NewSource(1)).Read(data)
	var cow, ref time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ws := b.TempDir()
		f, err := Open(ws, WithMaxStagedBytes(1<<30))
		if err != nil {
			b.Fatal(err)
		}
		tx, _ := f.Begin("bench")
		for j := 0; j < 1000; j++ {
			if err := tx.Write(fmt.Sprintf("d/f%04d", j), data, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		if _, err := tx.Commit(context.Background()); err != nil {
			b.Fatal(err)
		}
		cow += time.Since(start)
		b.StopTimer()
		f.Close()

		refDir := filepath.Join(b.TempDir(), "d")
		os.Mkdir(refDir, 0o755)
		start = time.Now()
		for j := 0; j < 1000; j++ {
			p := filepath.Join(refDir, fmt.Sprintf("f%04d", j))
			fl, err := os.Create(p + ".tmp")
			if err != nil {
				b.Fatal(err)
			}
			fl.Write(data)
			fl.Sync()
			fl.Close()
			os.Rename(p+".tmp", p)
		}
		d, _ := os.Open(refDir)
		d.Sync()
		d.Close()
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(cow)/float64(ref), "x-vs-fsync-writes")
}

// BenchmarkStage50MiB stages one 50 MiB file. The reference is writing
// the same bytes to a file and fsyncing it.
func BenchmarkStage50MiB(b *testing.B) {
	data := make([]byte, 50<<20)
	rand.New(rand.NewSource(3)).Read(data)
	b.SetBytes(int64(len(data)))
	var cow, ref time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ws := b.TempDir()
		f, err := Open(ws)
		if err != nil {
			b.Fatal(err)
		}
		tx, _ := f.Begin("bench")
		b.StartTimer()
		start := time.Now()
		if err := tx.Write("big.bin", data, 0); err != nil {
			b.Fatal(err)
		}
		cow += time.Since(start)
		b.StopTimer()
		f.Close()
		start = time.Now()
		fl, err := os.Create(filepath.Join(ws, "ref.bin"))
		if err != nil {
			b.Fatal(err)
		}
		fl.Write(data)
		fl.Sync()
		fl.Close()
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(cow)/float64(ref), "x-vs-writefile")
}
