package secrets

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"
)

// FuzzScrubber checks, for arbitrary secrets and text: no panic; Redact
// equals the naive leftmost-longest specification; Contains agrees with
// Redact; and a Writer fed random chunks writes exactly Redact's output,
// with and without detectors.
func FuzzScrubber(f *testing.F) {
	f.Add("abcd|bcde|cdefg", []byte("xxabcdefgyy abcde"), int64(1))
	f.Add("secret-token", []byte("a secret-token b secret-tok"), int64(2))
	f.Add("aaaa|aaaaa", []byte("aaaaaaaaaaaaa"), int64(3))
	f.Add("AKIA", []byte("AKIAIOSFODNN7EXAMPLE eyJhbGciOiJI.eyJzdWIi.sig"), int64(4))
	f.Add("pass", []byte("-----BEGIN EC PRIVATE KEY-----\nabc\n-----END EC PRIVATE KEY-----"), int64(5))
	f.Fuzz(func(t *testing.T, spec string, text []byte, seed int64) {
		var vals, pats []string
		for _, v := range strings.Split(spec, "|") {
			if len(strings.TrimSpace(v)) >= MinSecretLen && !strings.ContainsAny(v, "[]") {
				vals = append(vals, v)
				pats = append(pats, v, strings.TrimSpace(v))
			}
		}
		if len(vals) > 20 || len(text) > 1<<16 {
			return
		}
		plain, err := New(vals, WithEncodedForms(false))
		if err != nil {
			t.Fatal(err)
		}
		got := plain.Redact(string(text))
		want := naiveRedact(string(text), pats, func(string) string { return Redacted })
		if got != want {
			t.Fatalf("Redact = %q, spec says %q (secrets %q)", got, want, vals)
		}
		if plain.Contains(string(text)) != (got != string(text)) {
			t.Fatalf("Contains disagrees with Redact for %q", text)
		}
		r := rand.New(rand.NewSource(seed))
		for _, opts := range [][]Option{nil, {WithDetectors(AllDetectors()...)}} {
			s, err := New(vals, opts...)
			if err != nil {
				t.Fatal(err)
			}
			want := s.RedactBytes(text)
			var out bytes.Buffer
			w := s.NewWriter(&out)
			for rest := text; len(rest) > 0; {
				n := 1 + r.Intn(len(rest))
				if _, err := w.Write(rest[:n]); err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("stream %q != Redact %q", out.Bytes(), want)
			}
		}
	})
}
