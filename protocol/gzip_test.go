package protocol

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"errors"
	"io"
	"testing"
	"time"
)

// TestGzipWriterRoundTrips: whatever is written, in any chunking, a gzip
// reader gets back; a stream up to StoredGzipMax is one stored block (its
// size is the data's plus 23 bytes of framing), a longer one compressed.
func TestGzipWriterRoundTrips(t *testing.T) {
	random := make([]byte, 3*StoredGzipMax)
	rand.Read(random)
	text := bytes.Repeat([]byte("package main // the same line again\n"), 4*StoredGzipMax/36)
	for _, tc := range []struct {
		name   string
		data   []byte
		stored bool
	}{
		{"empty", nil, true},
		{"one byte", []byte("x"), true},
		{"at the bound", random[:StoredGzipMax], true},
		{"one past the bound", random[:StoredGzipMax+1], false},
		{"random", random, false},
		{"text", text, false},
	} {
		for _, chunk := range []int{1, 7, 4096, len(tc.data) + 1} {
			var out bytes.Buffer
			g := NewGzipWriter(&out, gzip.BestSpeed)
			for p := tc.data; len(p) > 0; {
				n := min(chunk, len(p))
				if k, err := g.Write(p[:n]); err != nil || k != n {
					t.Fatalf("%s: Write = %d, %v", tc.name, k, err)
				}
				p = p[n:]
			}
			if err := g.Close(); err != nil {
				t.Fatalf("%s: Close: %v", tc.name, err)
			}
			if stored := out.Len() == len(tc.data)+23; stored != tc.stored {
				t.Errorf("%s (chunks of %d): %d bytes for %d, stored %v, want %v", tc.name, chunk, out.Len(), len(tc.data), stored, tc.stored)
			}
			zr, err := gzip.NewReader(&out)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got, err := io.ReadAll(zr)
			if err != nil || !bytes.Equal(got, tc.data) {
				t.Fatalf("%s (chunks of %d): read back %d bytes, %v; want %d", tc.name, chunk, len(got), err, len(tc.data))
			}
		}
	}
	if out := new(bytes.Buffer); true {
		g := NewGzipWriter(out, gzip.BestSpeed)
		g.Write([]byte("x"))
		g.Close()
		if _, err := g.Write([]byte("y")); err == nil {
			t.Error("Write after Close succeeded")
		}
	}
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

// TestGzipWriterPassesErrors: the underlying writer's error comes back,
// wrapped or not, from the Write past the bound or from Close; a bad level
// is refused either way.
func TestGzipWriterPassesErrors(t *testing.T) {
	boom := errors.New("boom")
	g := NewGzipWriter(failWriter{boom}, gzip.BestSpeed)
	g.Write([]byte("small"))
	if err := g.Close(); !errors.Is(err, boom) {
		t.Errorf("Close of a small stream = %v, want boom", err)
	}
	g = NewGzipWriter(failWriter{boom}, gzip.BestSpeed)
	_, err := g.Write(make([]byte, StoredGzipMax+1))
	if err == nil {
		err = g.Close()
	}
	if !errors.Is(err, boom) {
		t.Errorf("large stream = %v, want boom", err)
	}
	for _, n := range []int{1, StoredGzipMax + 1} {
		g = NewGzipWriter(io.Discard, 42)
		_, err := g.Write(make([]byte, n))
		if err == nil {
			err = g.Close()
		}
		if err == nil {
			t.Errorf("level 42 with %d bytes accepted", n)
		}
	}
}

// BenchmarkGzipSmallArchive: a 2 KiB archive (a one-file workspace's tar)
// through GzipWriter against compress/gzip at BestSpeed, as packing
// wrote it before (x-vs-compress-gzip).
func BenchmarkGzipSmallArchive(b *testing.B) {
	data := bytes.Repeat([]byte("a"), 2048)
	var ours, ref time.Duration
	for b.Loop() {
		var out bytes.Buffer
		t0 := time.Now()
		g := NewGzipWriter(&out, gzip.BestSpeed)
		g.Write(data)
		g.Close()
		t1 := time.Now()
		out.Reset()
		zw, _ := gzip.NewWriterLevel(&out, gzip.BestSpeed)
		zw.Write(data)
		zw.Close()
		ours += t1.Sub(t0)
		ref += time.Since(t1)
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-compress-gzip")
}
