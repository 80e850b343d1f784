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

// timeOp returns the fastest of a few runs of f: the reference measured in
// the same process, under the same load, as the benchmark itself.
func timeOp(f func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for i := 0; i < 5; i++ {
		start := time.Now()
		f()
		if d := time.Since(start); d < best {
			best = d
		}
	}
	return best
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
	refTime := timeOp(func() { ref.Replace(str) })
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.RedactBytes(text)
	}
	b.StopTimer()
	per := float64(b.Elapsed()) / float64(b.N)
	b.ReportMetric(float64(refTime)/per, "x-vs-strings.Replacer")
}

func BenchmarkWriter(b *testing.B) {
	for _, chunk := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%d", chunk), func(b *testing.B) {
			vals := benchSecrets(100)
			s := NewScrubber(vals)
			text := benchCorpus(vals, 1<<20)
			str := string(text)
			ref := replacerBaseline(vals)
			refTime := timeOp(func() { ref.Replace(str) })
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w := s.NewWriter(io.Discard)
				for off := 0; off < len(text); off += chunk {
					end := min(off+chunk, len(text))
					w.Write(text[off:end])
				}
				w.Close()
			}
			b.StopTimer()
			per := float64(b.Elapsed()) / float64(b.N)
			b.ReportMetric(float64(refTime)/per, "x-vs-strings.Replacer")
		})
	}
}

func BenchmarkRedactDetectors(b *testing.B) {
	vals := benchSecrets(100)
	s := NewScrubber(vals, WithDetectors(AllDetectors()...))
	text := benchCorpus(vals, 1<<20)
	str := string(text)
	ref := replacerBaseline(vals)
	refTime := timeOp(func() { ref.Replace(str) })
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.RedactBytes(text)
	}
	b.StopTimer()
	b.ReportMetric(float64(refTime)/(float64(b.Elapsed())/float64(b.N)), "x-vs-strings.Replacer")
}
