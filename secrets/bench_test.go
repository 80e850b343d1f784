package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// benchCorpus is command output of the usual kinds (test logs, git hashes,
// base64 blobs, paths) with a few of the secrets planted in it.
func benchCorpus(secrets []string, size int) []byte {
	r := rand.New(rand.NewSource(7))
	words := []string{"ok", "PASS", "FAIL", "github.com/pulse-agent/pulse/backend", "--- PASS: TestExec (0.01s)",
		"error:", "main.go:42:13:", "the", "value", "build", "=== RUN", "Downloading", "100%", "{\"level\":\"info\"}"}
	var b bytes.Buffer
	for b.Len() < size {
		switch r.Intn(20) {
		case 0:
			raw := make([]byte, 20)
			r.Read(raw)
			b.WriteString("commit " + hex.EncodeToString(raw) + "\n")
		case 1:
			raw := make([]byte, 48)
			r.Read(raw)
			b.WriteString(base64.StdEncoding.EncodeToString(raw) + "\n")
		case 2:
			if r.Intn(50) == 0 {
				b.WriteString("token=" + secrets[r.Intn(len(secrets))] + "\n")
			}
		default:
			for k := 3 + r.Intn(8); k > 0; k-- {
				b.WriteString(words[r.Intn(len(words))])
				b.WriteByte(' ')
			}
			b.WriteByte('\n')
		}
	}
	return b.Bytes()[:size]
}

func benchSecrets(n int) []string {
	r := rand.New(rand.NewSource(3))
	const al = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	out := make([]string, n)
	for i := range out {
		out[i] = randString(r, al, 16+r.Intn(33))
	}
	return out
}

// replacerBaseline is the naive approach: a strings.Replacer over every
// value and every encoded form the Scrubber also covers.
func replacerBaseline(values []string) *strings.Replacer {
	var pairs []string
	for _, v := range values {
		pairs = append(pairs, v, Redacted)
		for _, f := range encodedForms(v) {
			pairs = append(pairs, f, Redacted)
		}
	}
	return strings.NewReplacer(pairs...)
}

// ratioVsRef times the reference and our function alternately, several
// rounds, and divides our fastest run by the fastest reference run (below
// 1 is faster, as every x-vs metric reads). The
// fastest of interleaved runs is what each costs when nothing else gets in
// the way, so the ratio holds up on a loaded machine, where a single timing
// of each would not.
func ratioVsRef(ref, ours func()) (ratio float64, best time.Duration) {
	bestRef, bestOurs := time.Duration(1<<63-1), time.Duration(1<<63-1)
	for i := 0; i < 7; i++ {
		start := time.Now()
		ref()
		bestRef = min(bestRef, time.Since(start))
		start = time.Now()
		ours()
		bestOurs = min(bestOurs, time.Since(start))
	}
	return float64(bestOurs) / float64(bestRef), bestOurs
}

// reportVsRef reports the ratio to the reference and our best throughput.
func reportVsRef(b *testing.B, size int, ref, ours func()) {
	ratio, best := ratioVsRef(ref, ours)
	b.ReportMetric(ratio, "x-vs-strings.Replacer")
	b.ReportMetric(float64(size)/best.Seconds()/1e6, "best-MB/s")
}

func BenchmarkRedact(b *testing.B) {
	vals := benchSecrets(100)
	s := NewScrubber(vals)
	text := benchCorpus(vals, 1<<20)
	str := string(text)
	ref := replacerBaseline(vals)
	if got, want := s.Redact(str), ref.Replace(str); strings.Count(got, Redacted) != strings.Count(want, Redacted) {
		b.Fatalf("scrubber found %d secrets, replacer %d", strings.Count(got, Redacted), strings.Count(want, Redacted))
	}
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.RedactBytes(text)
	}
	b.StopTimer()
	reportVsRef(b, len(text), func() { ref.Replace(str) }, func() { s.RedactBytes(text) })
}

func BenchmarkWriter(b *testing.B) {
	for _, chunk := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%d", chunk), func(b *testing.B) {
			vals := benchSecrets(100)
			s := NewScrubber(vals)
			text := benchCorpus(vals, 1<<20)
			str := string(text)
			ref := replacerBaseline(vals)
			stream := func() {
				w := s.NewWriter(io.Discard)
				for off := 0; off < len(text); off += chunk {
					w.Write(text[off:min(off+chunk, len(text))])
				}
				w.Close()
			}
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				stream()
			}
			b.StopTimer()
			reportVsRef(b, len(text), func() { ref.Replace(str) }, stream)
		})
	}
}

func BenchmarkRedactDetectors(b *testing.B) {
	vals := benchSecrets(100)
	s := NewScrubber(vals, WithDetectors(AllDetectors()...))
	text := benchCorpus(vals, 1<<20)
	str := string(text)
	ref := replacerBaseline(vals)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.RedactBytes(text)
	}
	b.StopTimer()
	reportVsRef(b, len(text), func() { ref.Replace(str) }, func() { s.RedactBytes(text) })
}
