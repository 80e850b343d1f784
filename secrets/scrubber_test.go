package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"math/rand"
	"net/url"
	"strings"
	"testing"
)

// naiveRedact is the specification of leftmost-longest replacement written
// the slow, obvious way: at each position try every pattern, take the
// longest, else copy one byte.
func naiveRedact(text string, pats []string, rep func(string) string) string {
	var b strings.Builder
	for i := 0; i < len(text); {
		best := ""
		for _, p := range pats {
			if len(p) > len(best) && strings.HasPrefix(text[i:], p) {
				best = p
			}
		}
		if best == "" {
			b.WriteByte(text[i])
			i++
			continue
		}
		b.WriteString(rep(best))
		i += len(best)
	}
	return b.String()
}

func randString(r *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.Intn(len(alphabet))]
	}
	return string(b)
}

func TestRedactMatchesNaiveSpecification(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for iter := 0; iter < 500; iter++ {
		// A tiny alphabet makes overlaps and shared prefixes common.
		alpha := "abc"
		if iter%3 == 0 {
			alpha = "abcdefgh"
		}
		var vals []string
		for k := 1 + r.Intn(6); k > 0; k-- {
			vals = append(vals, randString(r, alpha, MinSecretLen+r.Intn(6)))
		}
		s, err := New(vals, WithEncodedForms(false))
		if err != nil {
			t.Fatal(err)
		}
		text := randString(r, alpha+" ", r.Intn(200))
		want := naiveRedact(text, vals, func(string) string { return Redacted })
		if got := s.Redact(text); got != want {
			t.Fatalf("secrets %q text %q:\n got %q\nwant %q", vals, text, got, want)
		}
		if s.Contains(text) != (want != text) {
			t.Fatalf("Contains(%q) = %v with secrets %q", text, s.Contains(text), vals)
		}
	}
}

func TestStreamingEqualsRedactOfWhole(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for iter := 0; iter < 400; iter++ {
		alpha := "abcd"
		var vals []string
		for k := 1 + r.Intn(8); k > 0; k-- {
			vals = append(vals, randString(r, alpha, MinSecretLen+r.Intn(12)))
		}
		var opts []Option
		if iter%2 == 0 {
			opts = append(opts, WithNamed("TOKEN", vals[0]))
		}
		if iter%4 == 1 {
			opts = append(opts, WithDetectors(AllDetectors()...))
		}
		s := NewScrubber(vals, opts...)
		// Plant secrets and credential shapes in random text.
		var tb strings.Builder
		for tb.Len() < r.Intn(3000) {
			switch r.Intn(6) {
			case 0:
				tb.WriteString(vals[r.Intn(len(vals))])
			case 1:
				tb.WriteString(base64.StdEncoding.EncodeToString([]byte(vals[r.Intn(len(vals))])))
			case 2:
				tb.WriteString("AKIA" + randString(r, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 16))
			case 3:
				tb.WriteString("eyJhbGciOi.eyJzdWIi.sig-_" + randString(r, alpha, 3))
			default:
				tb.WriteString(randString(r, alpha+" \n", r.Intn(40)))
			}
		}
		text := tb.String()
		want := s.Redact(text)
		var out bytes.Buffer
		w := s.NewWriter(&out)
		rest := []byte(text)
		for len(rest) > 0 {
			n := 1 + r.Intn(len(rest))
			if r.Intn(3) == 0 {
				n = 1 + r.Intn(3)
			}
			if n > len(rest) {
				n = len(rest)
			}
			if _, err := w.Write(rest[:n]); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
			if !strings.HasPrefix(want, out.String()) {
				t.Fatalf("streamed output %q is not a prefix of Redact output %q", out.String(), want)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Fatalf("iteration %d: streamed output differs from Redact\n got %q\nwant %q", iter, out.String(), want)
		}
	}
}

func TestWriterHoldBack(t *testing.T) {
	s := NewScrubber([]string{"secretvalue"}, WithEncodedForms(false))
	var out bytes.Buffer
	w := s.NewWriter(&out)
	text := strings.Repeat("x", 100)
	if _, err := w.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
	if held := 100 - out.Len(); held != s.HoldBack() || s.HoldBack() != len("secretvalue")-1 {
		t.Fatalf("held %d bytes, HoldBack %d, want %d", held, s.HoldBack(), len("secretvalue")-1)
	}
	w.Write([]byte("secretval"))
	w.Write([]byte("ue tail"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), text+"[REDACTED] tail"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v, want ErrClosed", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestEncodedFormsAndNames(t *testing.T) {
	const v = "hunter2-s3cr3t/value"
	s := NewScrubber(nil, WithNamed("DB_PASSWORD", v))
	big := base64.StdEncoding.EncodeToString([]byte("prefix:" + v + ":suffix"))
	cases := map[string]string{
		"plain":        "pw=" + v,
		"base64":       base64.StdEncoding.EncodeToString([]byte(v)),
		"base64url":    base64.RawURLEncoding.EncodeToString([]byte(v)),
		"hex":          hex.EncodeToString([]byte(v)),
		"HEX":          strings.ToUpper(hex.EncodeToString([]byte(v))),
		"query":        url.QueryEscape(v),
		"path":         url.PathEscape(v),
		"base64 embed": big,
	}
	for name, text := range cases {
		got := s.Redact(text)
		if !strings.Contains(got, "[REDACTED:DB_PASSWORD]") {
			t.Errorf("%s: %q not redacted: %q", name, text, got)
		}
		if !s.Contains(text) {
			t.Errorf("%s: Contains = false", name)
		}
	}
	plain := NewScrubber([]string{v}, WithEncodedForms(false))
	if got := plain.Redact(hex.EncodeToString([]byte(v))); strings.Contains(got, "REDACTED") {
		t.Fatalf("encoded forms off but hex redacted: %q", got)
	}
}

func TestNewRefusesShortValues(t *testing.T) {
	_, err := New([]string{"abc", "okay-long", "xy"}, WithNamed("PIN", "123"))
	if !errors.Is(err, ErrTooShort) {
		t.Fatalf("err = %v, want ErrTooShort", err)
	}
	if !strings.Contains(err.Error(), "3 value(s)") {
		t.Fatalf("error does not say how many: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("NewScrubber did not panic on a short value")
		}
	}()
	NewScrubber([]string{"abc"})
}

func TestInvalidName(t *testing.T) {
	if _, err := New(nil, WithNamed("bad]name", "longenough")); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("err = %v, want ErrInvalidName", err)
	}
}

func TestNilScrubberRedactsNothing(t *testing.T) {
	for _, s := range []*Scrubber{nil, {}, NewScrubber(nil)} {
		if s.Redact("abc") != "abc" || s.Contains("abc") || string(s.RedactBytes([]byte("abc"))) != "abc" || s.HoldBack() != 0 {
			t.Fatal("empty scrubber changed text")
		}
		var out bytes.Buffer
		w := s.NewWriter(&out)
		w.Write([]byte("hello"))
		w.Close()
		if out.String() != "hello" {
			t.Fatalf("got %q", out.String())
		}
	}
}

func TestDetectors(t *testing.T) {
	s := NewScrubber(nil, WithDetectors(AllDetectors()...))
	pem := "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\nabcd==\n-----END RSA PRIVATE KEY-----"
	cases := []struct{ in, want string }{
		{"key AKIAIOSFODNN7EXAMPLE end", "key [REDACTED:aws-access-key-id] end"},
		{"t=ghp_" + strings.Repeat("a1", 18) + ".", "t=[REDACTED:github-token]."},
		{"github_pat_" + strings.Repeat("Ab_", 10) + " x", "[REDACTED:github-token] x"},
		{"Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl\n", "Bearer [REDACTED:jwt]\n"},
		{"a\n" + pem + "\nb", "a\n[REDACTED:pem-private-key]\nb"},
		{"-----BEGIN PUBLIC KEY-----\nabc\n-----END PUBLIC KEY-----", "-----BEGIN PUBLIC KEY-----\nabc\n-----END PUBLIC KEY-----"},
		{"AKIA short", "AKIA short"},
		{"ghp_tooshort", "ghp_tooshort"},
		{"eyJnotajwt", "eyJnotajwt"},
	}
	for _, c := range cases {
		if got := s.Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if NewScrubber(nil).Redact(cases[0].in) != cases[0].in {
		t.Fatal("detectors are on by default")
	}
}

func TestSecretPolicy(t *testing.T) {
	if DenyAllSecrets().Allows("X") || (Policy{}).Allows("X") || (Policy{Mode: "bogus"}).Allows("X") {
		t.Fatal("deny-all, zero or unknown policy allowed a secret")
	}
	if !AllowAllSecrets().Allows("X") {
		t.Fatal("allow-all refused")
	}
	p := AllowSecrets("A", "B")
	got := p.Filter([]Secret{{Name: "A", Value: "1111"}, {Name: "C", Value: "2222"}, {Name: "B", Value: "3333"}})
	if len(got) != 2 || got[0].Name != "A" || got[1].Name != "B" {
		t.Fatalf("Filter = %v", got)
	}
	if (Policy{Mode: "bogus"}).Validate() == nil {
		t.Fatal("Validate accepted an unknown mode")
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv("PULSE_TEST_TOKEN", "tok-123456")
	t.Setenv("PULSE_TEST_EMPTY", "")
	got := FromEnv("PULSE_TEST_TOKEN", "PULSE_TEST_EMPTY", "PULSE_TEST_UNSET_XYZ")
	if len(got) != 1 || got[0] != (Secret{Name: "PULSE_TEST_TOKEN", Value: "tok-123456"}) {
		t.Fatalf("FromEnv = %v", got)
	}
	s := NewScrubber(nil, WithSecrets(got...))
	if out := s.Redact("x tok-123456 y"); out != "x [REDACTED:PULSE_TEST_TOKEN] y" {
		t.Fatalf("Redact = %q", out)
	}
}

// TestStreamingLargeWrites covers writes much longer than the hold-back,
// which are scanned in place, with detectors on (a 16 KiB window).
func TestStreamingLargeWrites(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	vals := []string{"alpha-secret-1", "beta-secret-22", "gamma-333"}
	s := NewScrubber(vals, WithDetectors(AllDetectors()...))
	var tb strings.Builder
	// Larger than several of the 256 KiB reads the backends hand the
	// writer (backend.OutputChunk), so that matches straddle their seams.
	for tb.Len() < 1<<20 {
		switch r.Intn(8) {
		case 0:
			tb.WriteString(vals[r.Intn(len(vals))])
		case 1:
			tb.WriteString("-----BEGIN PRIVATE KEY-----\n" + randString(r, "abcXYZ012+/\n", r.Intn(3000)) + "\n-----END PRIVATE KEY-----")
		case 2:
			tb.WriteString("ghp_" + randString(r, "abcdefXYZ0123", 36+r.Intn(10)))
		default:
			tb.WriteString(randString(r, "abc \n-", r.Intn(500)))
		}
	}
	text := []byte(tb.String())
	want := s.RedactBytes(text)
	for round := 0; round < 4; round++ {
		var out bytes.Buffer
		w := s.NewWriter(&out)
		for rest := text; len(rest) > 0; {
			n := min(len(rest), 1+r.Intn(300<<10))
			switch round {
			case 0:
				n = min(len(rest), 64<<10+1)
			case 1:
				n = min(len(rest), 256<<10)
			}
			w.Write(rest[:n])
			rest = rest[n:]
		}
		w.Close()
		if !bytes.Equal(out.Bytes(), want) {
			t.Fatalf("round %d: streamed output differs from Redact", round)
		}
	}
	if !bytes.Contains(want, []byte("[REDACTED:pem-private-key]")) || !bytes.Contains(want, []byte("[REDACTED:github-token]")) {
		t.Fatal("planted credentials were not found")
	}
}

// failWriter fails every write, to check the error is sticky.
type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) { f.n++; return 0, errors.New("disk full") }

func TestWriterErrorIsSticky(t *testing.T) {
	s := NewScrubber([]string{"secret"})
	fw := &failWriter{}
	w := s.NewWriter(fw)
	if _, err := w.Write(bytes.Repeat([]byte("x"), 1000)); err == nil {
		t.Fatal("write error not reported")
	}
	if _, err := w.Write([]byte("y")); err == nil || fw.n != 1 {
		t.Fatalf("second write: err %v after %d underlying writes", err, fw.n)
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close did not report the earlier error")
	}
}

// TestMatcherAgainstNaive drives the automaton directly with patterns of
// every length from 1 byte, so each filter mode (none, 3-byte, 4-byte
// blocks) and the plain DFA are checked against the specification.
func TestMatcherAgainstNaive(t *testing.T) {
	r := rand.New(rand.NewSource(9))
	for iter := 0; iter < 2000; iter++ {
		minLen := 1 + r.Intn(6)
		seen := map[string]bool{}
		var pats [][]byte
		var strs []string
		for k := 1 + r.Intn(8); k > 0; k-- {
			p := randString(r, "abc", minLen+r.Intn(5))
			if !seen[p] {
				seen[p] = true
				pats = append(pats, []byte(p))
				strs = append(strs, p)
			}
		}
		m := newMatcher(pats)
		text := randString(r, "abcd", r.Intn(120))
		var b strings.Builder
		pos := 0
		for {
			s, e, p := m.next([]byte(text), pos)
			if s < 0 {
				break
			}
			if text[s:e] != strs[p] {
				t.Fatalf("match %d..%d %q reported as pattern %q", s, e, text[s:e], strs[p])
			}
			b.WriteString(text[pos:s])
			b.WriteString("<" + text[s:e] + ">")
			pos = e
		}
		b.WriteString(text[pos:])
		want := naiveRedact(text, strs, func(p string) string { return "<" + p + ">" })
		if b.String() != want {
			t.Fatalf("patterns %q text %q:\n got %q\nwant %q", strs, text, b.String(), want)
		}
	}
}

// TestWriterConcurrentCloseIsSafe: a late Write racing Close either lands
// before it or gets ErrClosed; the race detector checks the rest.
func TestWriterConcurrentCloseIsSafe(t *testing.T) {
	s := NewScrubber([]string{"secret-value"})
	var out bytes.Buffer
	w := s.NewWriter(&out)
	done := make(chan error)
	go func() {
		var err error
		for i := 0; i < 1000 && err == nil; i++ {
			_, err = w.Write([]byte("chunk secret-value "))
		}
		done <- err
	}()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("late Write: %v", err)
	}
	if strings.Contains(out.String(), "secret-value") {
		t.Fatal("secret leaked")
	}
}

func TestTrailingNewlineValue(t *testing.T) {
	s := NewScrubber(nil, WithNamed("TOKEN_FILE", "tok-abcdef\n"))
	if got := s.Redact(`echo "tok-abcdef" done`); got != `echo "[REDACTED:TOKEN_FILE]" done` {
		t.Fatalf("trimmed value not redacted: %q", got)
	}
	if got := s.Redact("tok-abcdef\nnext"); got != "[REDACTED:TOKEN_FILE]next" {
		t.Fatalf("full value not preferred: %q", got)
	}
	if _, err := New([]string{"abc\n"}); !errors.Is(err, ErrTooShort) {
		t.Fatalf("3 bytes plus a newline accepted: %v", err)
	}
}

func TestScrubberConcurrentUse(t *testing.T) {
	s := NewScrubber([]string{"shared-secret"}, WithDetectors(AllDetectors()...))
	done := make(chan string)
	for g := 0; g < 8; g++ {
		go func() { done <- s.Redact("a shared-secret b AKIAIOSFODNN7EXAMPLE") }()
	}
	for g := 0; g < 8; g++ {
		if got := <-done; got != "a [REDACTED] b [REDACTED:aws-access-key-id]" {
			t.Fatalf("got %q", got)
		}
	}
}

// TestContainsReaderAcrossChunks: a secret anywhere in a stream, also
// straddling ContainsReader's chunk boundary, is found; a stream without
// it is not.
func TestContainsReaderAcrossChunks(t *testing.T) {
	const secret = "s3cr3t-value-for-the-stream"
	s, err := New([]string{secret})
	if err != nil {
		t.Fatal(err)
	}
	filler := bytes.Repeat([]byte("x"), 3*streamChunk)
	if hit, err := s.ContainsReader(bytes.NewReader(filler)); err != nil || hit {
		t.Fatalf("clean stream: hit %v, err %v", hit, err)
	}
	for _, at := range []int{0, streamChunk - 5, streamChunk, 2*streamChunk + 3, len(filler) - len(secret)} {
		b := bytes.Clone(filler)
		copy(b[at:], secret)
		if hit, err := s.ContainsReader(bytes.NewReader(b)); err != nil || !hit {
			t.Errorf("secret at %d: hit %v, err %v", at, hit, err)
		}
	}
}

// sourceTaker is a writer that takes output from its source itself, as
// the sandbox's queue for a caller's writer does.
type sourceTaker struct {
	bytes.Buffer
	took int
}

func (s *sourceTaker) ReadOutputFrom(r io.Reader) (int64, error) {
	s.took++
	return s.ReadFrom(r)
}

// TestWriterHandsOnSourceOnlyWithNothingToRedact: a writer with nothing to
// redact hands the source to a writer that takes it itself (until Close),
// and one with secrets never does: every byte of it must pass the
// scrubber.
func TestWriterHandsOnSourceOnlyWithNothingToRedact(t *testing.T) {
	dst := &sourceTaker{}
	w := (*Scrubber)(nil).NewWriter(dst)
	or, ok := w.(outputReader)
	if !ok {
		t.Fatal("a writer with nothing to redact does not hand on its source")
	}
	if n, err := or.ReadOutputFrom(strings.NewReader("plain output")); err != nil || n != 12 || dst.took != 1 || dst.String() != "plain output" {
		t.Fatalf("ReadOutputFrom: %d, %v; took %d, %q", n, err, dst.took, dst.String())
	}
	w.Close()
	if _, err := or.ReadOutputFrom(strings.NewReader("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadOutputFrom after Close: %v", err)
	}
	for _, s := range []*Scrubber{NewScrubber([]string{"secret-value"}), NewScrubber(nil, WithDetectors(AllDetectors()...))} {
		if _, ok := s.NewWriter(dst).(outputReader); ok {
			t.Fatal("a scrubbing writer hands its source on unscrubbed")
		}
	}
}
