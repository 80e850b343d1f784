package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"io"
	"net/url"
	"strings"
)

// MinSecretLen is the shortest value a Scrubber accepts. Shorter values
// would match all over ordinary output and shred it.
const MinSecretLen = 4

// Errors returned by New; test with errors.Is.
var (
	// ErrTooShort: one or more values are shorter than MinSecretLen.
	ErrTooShort = errors.New("secret value too short")
	// ErrInvalidName: a secret name is empty or has characters other than
	// letters, digits, '_', '-' and '.'.
	ErrInvalidName = errors.New("invalid secret name")
	// ErrClosed: a Writer was used after Close.
	ErrClosed = errdefs.New("writer closed", errdefs.ErrClosed)
)

// Redacted is what an unnamed secret is replaced with. A named secret is
// replaced with "[REDACTED:name]".
const Redacted = "[REDACTED]"

// Secret is a value to redact and, optionally, the name it is known by
// (an environment variable, say). The name appears in the replacement text;
// the value never does.
type Secret struct {
	Name  string
	Value string
}

// Option configures a Scrubber.
type Option func(*options) error

type options struct {
	named     []Secret
	encodings bool
	detectors []Detector
}

// WithNamed adds a secret that is replaced with "[REDACTED:name]".
func WithNamed(name, value string) Option {
	return WithSecrets(Secret{Name: name, Value: value})
}

// WithSecrets adds secrets, as returned by FromEnv. A Secret with an empty
// Name is replaced with the plain "[REDACTED]".
func WithSecrets(list ...Secret) Option {
	return func(o *options) error {
		for _, s := range list {
			if s.Name != "" && !validName(s.Name) {
				return fmt.Errorf("secrets: %w: %q", ErrInvalidName, s.Name)
			}
			o.named = append(o.named, s)
		}
		return nil
	}
}

// WithEncodedForms sets whether the base64 (standard and URL alphabets,
// padded or not, and at each of the three byte alignments inside a longer
// base64 text), hex (lower and upper case) and URL-encoded forms of every
// value are redacted too. It is on by default.
func WithEncodedForms(on bool) Option {
	return func(o *options) error { o.encodings = on; return nil }
}

// WithDetectors turns on built-in detectors for well-known credential
// shapes. They are off by default: they find secrets nobody configured, at
// the cost of a longer hold-back in streams (see NewWriter).
func WithDetectors(d ...Detector) Option {
	return func(o *options) error {
		for _, x := range d {
			if _, ok := detectorSpecs[x]; !ok {
				return fmt.Errorf("secrets: unknown detector %q", string(x))
			}
		}
		o.detectors = append(o.detectors, d...)
		return nil
	}
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Scrubber replaces secrets in text. It is immutable and safe for
// concurrent use. A nil (or zero) Scrubber redacts nothing.
type Scrubber struct {
	lit      *matcher
	reps     [][]byte // replacement per literal pattern
	det      *detectorSet
	count    int // distinct secret values
	longest  int // longest literal pattern
	patterns int
}

// NewScrubber is New for values known to be valid: it panics where New
// returns an error, as regexp.MustCompile does.
func NewScrubber(values []string, opts ...Option) *Scrubber {
	s, err := New(values, opts...)
	if err != nil {
		panic(err)
	}
	return s
}

// New returns a Scrubber that replaces every value (and, unless
// WithEncodedForms(false), its encoded forms) with "[REDACTED]", and every
// named secret with "[REDACTED:name]". Overlapping matches are resolved
// leftmost-longest: the match that starts first wins, and of those the
// longest. A value with white space around it is also redacted without
// it. Empty values are ignored; a value shorter than MinSecretLen (not
// counting surrounding white space) is an error wrapping ErrTooShort that
// says how many there are. A value given both plainly and by name is
// redacted with its name (the first name given wins).
func New(values []string, opts ...Option) (*Scrubber, error) {
	o := options{encodings: true}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	all := make([]Secret, 0, len(values)+len(o.named))
	all = append(all, o.named...) // named first: they win ties below
	for _, v := range values {
		all = append(all, Secret{Value: v})
	}
	short := 0
	for _, s := range all {
		// A value read from a file often ends in a newline that the
		// program printing it drops, so the trimmed value is redacted
		// too, and it is what must be long enough.
		if s.Value != "" && len(strings.TrimSpace(s.Value)) < MinSecretLen {
			short++
		}
	}
	if short > 0 {
		return nil, fmt.Errorf("secrets: %w: %d value(s) shorter than %d bytes (ignoring surrounding white space)", ErrTooShort, short, MinSecretLen)
	}

	// One pattern per distinct byte string; a form shared by two secrets
	// keeps the replacement of the first (named before unnamed).
	index := map[string]int{}
	var pats [][]byte
	var reps [][]byte
	add := func(form string, rep []byte) {
		if len(form) < MinSecretLen {
			return
		}
		if _, dup := index[form]; dup {
			return
		}
		index[form] = len(pats)
		pats = append(pats, []byte(form))
		reps = append(reps, rep)
	}
	type base struct {
		value string
		rep   []byte
	}
	var bases []base
	seen := map[string]bool{}
	sc := &Scrubber{}
	for _, s := range all {
		if s.Value == "" {
			continue
		}
		if !seen[s.Value] {
			seen[s.Value] = true
			sc.count++
		}
		rep := []byte(Redacted)
		if s.Name != "" {
			rep = []byte("[REDACTED:" + s.Name + "]")
		}
		bases = append(bases, base{s.Value, rep})
		if t := strings.TrimSpace(s.Value); t != s.Value {
			bases = append(bases, base{t, rep})
		}
	}
	for _, b := range bases {
		add(b.value, b.rep)
	}
	if o.encodings {
		for _, b := range bases {
			for _, f := range encodedForms(b.value) {
				add(f, b.rep)
			}
		}
	}
	sc.lit = newMatcher(pats)
	sc.reps = reps
	sc.patterns = len(pats)
	sc.longest = sc.lit.maxLen
	if len(o.detectors) > 0 {
		sc.det = newDetectorSet(o.detectors)
	}
	return sc, nil
}

// minCoreLen is the shortest base64 text taken from the middle of a longer
// encoding; shorter cores would match unrelated base64.
const minCoreLen = 12

// encodedForms lists the ways v commonly appears encoded in output.
func encodedForms(v string) []string {
	b := []byte(v)
	forms := []string{
		hex.EncodeToString(b),
		strings.ToUpper(hex.EncodeToString(b)),
		url.QueryEscape(v),
		url.PathEscape(v),
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		forms = append(forms, enc.EncodeToString(b))
		// Inside a longer base64 text the value starts at one of three
		// byte alignments. Only whole 3-byte groups of the value encode
		// to characters that do not depend on the neighbours.
		for skip := 0; skip < 3; skip++ {
			if skip >= len(b) {
				break
			}
			rest := b[skip:]
			full := len(rest) / 3 * 3
			if core := enc.EncodeToString(rest[:full]); len(core) >= minCoreLen {
				forms = append(forms, core)
			}
		}
	}
	return forms
}

// Longest is the length of the longest byte string the Scrubber matches
// literally (a value or one of its encoded forms).
func (s *Scrubber) Longest() int {
	if s.none() {
		return 0
	}
	return s.longest
}

// HoldBack is the most bytes a Writer from NewWriter keeps back before it
// can tell whether they start a secret: Longest()-1, plus the longest
// credential shape minus one when detectors are on.
func (s *Scrubber) HoldBack() int {
	if s.none() {
		return 0
	}
	h := 0
	if s.longest > 0 {
		h = s.longest - 1
	}
	if s.det != nil {
		h += s.det.maxLen - 1
	}
	return h
}

// Len is the number of distinct secret values.
func (s *Scrubber) Len() int {
	if s.none() {
		return 0
	}
	return s.count
}

// Redact returns s with every secret replaced.
func (s *Scrubber) Redact(text string) string {
	if s.none() {
		return text
	}
	out, changed := s.redact([]byte(text))
	if !changed {
		return text
	}
	return string(out)
}

// RedactBytes returns b with every secret replaced. It returns b itself
// when there is nothing to replace, and a new slice otherwise.
func (s *Scrubber) RedactBytes(b []byte) []byte {
	if s.none() {
		return b
	}
	out, _ := s.redact(b)
	return out
}

func (s *Scrubber) redact(b []byte) ([]byte, bool) {
	out, changed := replaceAll(literalStage{s.lit, s.reps}, b)
	if s.det != nil {
		var c2 bool
		out, c2 = replaceAll(detectorStage{s.det}, out)
		changed = changed || c2
	}
	return out, changed
}

// Contains reports whether text holds any secret (or, with detectors on,
// any credential shape). Use it to refuse content that embeds one.
func (s *Scrubber) Contains(text string) bool {
	if s.none() {
		return false
	}
	return s.ContainsBytes([]byte(text))
}

// ContainsBytes is Contains for a byte slice.
func (s *Scrubber) ContainsBytes(b []byte) bool {
	if s.none() {
		return false
	}
	if st, _, _ := s.lit.next(b, 0); st >= 0 {
		return true
	}
	if s.det != nil {
		if st, _, _ := s.det.next(b, 0); st >= 0 {
			return true
		}
	}
	return false
}

// replaceAll replaces every leftmost-longest match of st in b. It returns b
// itself when there is none. Generic rather than over the interface, so
// that a literal or detector stage is not boxed on every call.
func replaceAll[S stage](st S, b []byte) ([]byte, bool) {
	start, end, rep := st.find(b, 0)
	if start < 0 {
		return b, false
	}
	var out bytes.Buffer
	out.Grow(len(b))
	prev := 0
	for start >= 0 {
		out.Write(b[prev:start])
		out.Write(rep)
		prev = end
		start, end, rep = st.find(b, end)
	}
	out.Write(b[prev:])
	return out.Bytes(), true
}

// none reports a nil or zero Scrubber, which redacts nothing.
func (s *Scrubber) none() bool { return s == nil || s.lit == nil }

// ContainsReader is Contains for everything r yields, read in bounded
// memory: chunks overlapping by HoldBack bytes, so that a secret split
// across two reads is still found.
func (s *Scrubber) ContainsReader(r io.Reader) (bool, error) {
	if s.none() {
		return false, nil
	}
	keep := s.HoldBack()
	buf := make([]byte, keep+streamChunk)
	have := 0
	for {
		n, err := io.ReadFull(r, buf[have:])
		if n > 0 {
			if s.ContainsBytes(buf[:have+n]) {
				return true, nil
			}
			have += n
			if tail := min(keep, have); tail > 0 {
				copy(buf, buf[have-tail:have])
				have = tail
			} else {
				have = 0
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// streamChunk is how much ContainsReader reads at a time.
const streamChunk = 1 << 20
