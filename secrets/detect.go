package secrets

import (
	"bytes"
	"sort"
)

// Detector names a built-in detector for a well-known credential shape.
type Detector string

// The built-in detectors. A match is replaced with "[REDACTED:<detector>]".
const (
	// DetectPEMPrivateKey: a PEM block "-----BEGIN ... PRIVATE KEY-----"
	// through its END line. A block with no END line within 16 KiB is
	// redacted up to where the base64 body stops (failing closed).
	DetectPEMPrivateKey Detector = "pem-private-key"
	// DetectAWSAccessKeyID: AKIA..., ASIA... and the other AWS key id
	// prefixes followed by 16 upper-case letters or digits.
	DetectAWSAccessKeyID Detector = "aws-access-key-id"
	// DetectGitHubToken: ghp_, gho_, ghu_, ghs_, ghr_ tokens and
	// fine-grained github_pat_ tokens.
	DetectGitHubToken Detector = "github-token"
	// DetectJWT: a JSON Web Token, three base64url segments whose first
	// two start with "eyJ" (the encoding of `{"`).
	DetectJWT Detector = "jwt"
)

// AllDetectors returns every built-in detector.
func AllDetectors() []Detector {
	return []Detector{DetectPEMPrivateKey, DetectAWSAccessKeyID, DetectGitHubToken, DetectJWT}
}

// A detector is found by a literal trigger at its start and then checked by
// hand. The result for a start s must depend only on the bytes
// t[s:s+maxLen]: that is what lets a stream decide a match once it holds
// maxLen bytes past its start. detectorSet.next holds the rule: match is
// given t cut at s+maxLen, so it cannot look further.
type detectorSpec struct {
	triggers []string
	maxLen   int
	// match returns the end of the match starting at s, or ok false and
	// the position from which a later start could succeed (> s). t ends
	// at s+maxLen or before.
	match func(t []byte, s int, trigger string) (end int, ok bool, resume int)
}

const (
	pemMaxLen    = 16 << 10
	jwtMaxLen    = 8 << 10
	githubMaxLen = 255
)

var detectorSpecs = map[Detector]detectorSpec{
	DetectAWSAccessKeyID: {
		triggers: []string{"AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AIPA", "ANPA", "ANVA", "APKA", "AROA", "ASCA"},
		maxLen:   20,
		match: func(t []byte, s int, _ string) (int, bool, int) {
			if s+20 > len(t) {
				return 0, false, s + 1
			}
			for i := s + 4; i < s+20; i++ {
				if c := t[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
					return 0, false, s + 1
				}
			}
			return s + 20, true, 0
		},
	},
	DetectGitHubToken: {
		triggers: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"},
		maxLen:   githubMaxLen,
		match: func(t []byte, s int, trig string) (int, bool, int) {
			min, under := 36, false
			if trig == "github_pat_" {
				min, under = 22, true
			}
			limit := len(t)
			i := s + len(trig)
			for i < limit && (isAlnum(t[i]) || under && t[i] == '_') {
				i++
			}
			if i-(s+len(trig)) < min {
				return 0, false, s + 1
			}
			return i, true, 0
		},
	},
	DetectJWT: {
		triggers: []string{"eyJ"},
		maxLen:   jwtMaxLen,
		match: func(t []byte, s int, _ string) (int, bool, int) {
			limit := len(t)
			run := func(i int) int {
				for i < limit && isB64URL(t[i]) {
					i++
				}
				return i
			}
			i := run(s)
			// A later start inside this first segment shares its end and
			// everything after it, so it fails the same way unless a scan
			// stopped at the window's edge: then only s itself is known
			// to fail.
			fail := i
			if i >= limit {
				fail = s + 1
			}
			if i-s < 10 || i >= limit || t[i] != '.' {
				return 0, false, fail
			}
			p := i + 1
			if !bytes.HasPrefix(t[p:limit], []byte("eyJ")) {
				return 0, false, fail
			}
			i = run(p)
			if i >= limit {
				return 0, false, s + 1
			}
			if i-p < 4 || t[i] != '.' {
				return 0, false, fail
			}
			return run(i + 1), true, 0
		},
	},
	DetectPEMPrivateKey: {
		triggers: []string{"-----BEGIN "},
		maxLen:   pemMaxLen,
		match: func(t []byte, s int, trig string) (int, bool, int) {
			limit := len(t)
			i := s + len(trig)
			for i < limit && i-s < 64 && (t[i] >= 'A' && t[i] <= 'Z' || t[i] >= '0' && t[i] <= '9' || t[i] == ' ') {
				i++
			}
			const head = "PRIVATE KEY-----"
			if !bytes.HasSuffix(t[s+len(trig):i], []byte("PRIVATE KEY")) || !bytes.HasPrefix(t[i:limit], []byte("-----")) {
				return 0, false, s + 1
			}
			i += len("-----")
			if e := bytes.Index(t[i:limit], []byte("-----END ")); e >= 0 {
				j := i + e + len("-----END ")
				if k := bytes.Index(t[j:limit], []byte(head)); k >= 0 && k <= 64 {
					return j + k + len(head), true, 0
				}
			}
			// No END in reach: take the body as far as it looks like one.
			for i < limit && isPEMBody(t[i]) {
				i++
			}
			return i, true, 0
		},
	},
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isB64URL(c byte) bool { return isAlnum(c) || c == '-' || c == '_' }

func isPEMBody(c byte) bool {
	return isAlnum(c) || c == '+' || c == '/' || c == '=' || c == '\n' || c == '\r' || c == ' ' || c == '\t' || c == ':' || c == ',' || c == '-'
}

type detectorSet struct {
	trig    *matcher
	owner   []Detector // per trigger pattern
	names   []string   // per trigger pattern: the trigger text
	reps    map[Detector][]byte
	maxLen  int
	enabled map[Detector]bool
}

func newDetectorSet(ds []Detector) *detectorSet {
	set := &detectorSet{reps: map[Detector][]byte{}, enabled: map[Detector]bool{}}
	uniq := append([]Detector(nil), ds...)
	sort.Slice(uniq, func(i, j int) bool { return uniq[i] < uniq[j] })
	var pats [][]byte
	for _, d := range uniq {
		if set.enabled[d] {
			continue
		}
		set.enabled[d] = true
		spec := detectorSpecs[d]
		set.reps[d] = []byte("[REDACTED:" + string(d) + "]")
		if spec.maxLen > set.maxLen {
			set.maxLen = spec.maxLen
		}
		for _, tr := range spec.triggers {
			pats = append(pats, []byte(tr))
			set.owner = append(set.owner, d)
			set.names = append(set.names, tr)
		}
	}
	set.trig = newMatcher(pats)
	return set
}

// next returns the earliest credential match starting at or after from.
// No two triggers can start at the same byte, so the earliest trigger that
// checks out is the leftmost match.
func (d *detectorSet) next(t []byte, from int) (start, end int, rep []byte) {
	pos := from
	for pos < len(t) {
		ts, _, tp := d.trig.next(t, pos)
		if ts < 0 {
			return -1, -1, nil
		}
		spec := detectorSpecs[d.owner[tp]]
		e, ok, resume := spec.match(t[:min(ts+spec.maxLen, len(t))], ts, d.names[tp])
		if ok {
			return ts, e, d.reps[d.owner[tp]]
		}
		if resume <= ts {
			resume = ts + 1
		}
		pos = resume
	}
	return -1, -1, nil
}
