package secrets

import (
	"strings"
	"testing"
)

// TestDetectorWindow: no detector looks past maxLen bytes from where its
// match starts, however far the input would let the match run. That is
// the rule that lets a stream decide a match once it holds maxLen bytes.
func TestDetectorWindow(t *testing.T) {
	for _, c := range []struct {
		d       Detector
		in      string
		wantEnd int // -1: no match
	}{
		{DetectGitHubToken, "ghp_" + strings.Repeat("a", 400), githubMaxLen},
		{DetectJWT, "eyJ" + strings.Repeat("a", jwtMaxLen+100) + ".eyJabcd.sig", -1},
		{DetectPEMPrivateKey, "-----BEGIN RSA PRIVATE KEY-----\n" + strings.Repeat("A", pemMaxLen+100) + "\n-----END RSA PRIVATE KEY-----", pemMaxLen},
		{DetectAWSAccessKeyID, "AKIA" + strings.Repeat("B", 40), 20},
	} {
		set := newDetectorSet([]Detector{c.d})
		start, end, _ := set.next([]byte(c.in), 0)
		if c.wantEnd < 0 {
			if start >= 0 {
				t.Errorf("%s: match [%d,%d), want none (its first segment runs past the window)", c.d, start, end)
			}
			continue
		}
		if start != 0 || end != c.wantEnd {
			t.Errorf("%s: match [%d,%d), want [0,%d)", c.d, start, end, c.wantEnd)
		}
	}
}
