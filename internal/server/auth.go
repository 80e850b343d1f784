package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/pulse-agent/pulse/internal/bearer"
)

// ErrWeakToken: a production token is short, placeholder-like or of low
// entropy.
var ErrWeakToken = errors.New("insecure token")

// MinTokenLen is the shortest token production mode accepts.
const MinTokenLen = 32

// placeholders are substrings that mark a token someone copied from an
// example rather than generated.
var placeholders = []string{
	"changeme", "change-me", "change_me", "example", "placeholder", "replace",
	"password", "secret", "default", "insecure", "dummy", "sample", "your-token",
	"your_token", "token", "test", "todo", "qwerty",
}

// ParseTokens splits a comma-separated PULSE_REMOTE_TOKEN value, dropping
// empty entries.
func ParseTokens(v string) []string {
	var out []string
	for _, t := range strings.Split(v, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// CheckTokenStrength returns an error wrapping ErrWeakToken when t is not
// fit for production: shorter than MinTokenLen, containing a placeholder
// word, or with too little variety to be random (fewer than 10 distinct
// characters, or under 3 bits of Shannon entropy per character).
func CheckTokenStrength(t string) error {
	if len(t) < MinTokenLen {
		return fmt.Errorf("token shorter than %d characters: %w", MinTokenLen, ErrWeakToken)
	}
	lower := strings.ToLower(t)
	for _, p := range placeholders {
		if strings.Contains(lower, p) {
			return fmt.Errorf("token looks like a placeholder: %w", ErrWeakToken)
		}
	}
	counts := map[rune]int{}
	n := 0
	for _, r := range t {
		counts[r]++
		n++
	}
	if len(counts) < 10 {
		return fmt.Errorf("token has only %d distinct characters: %w", len(counts), ErrWeakToken)
	}
	var h float64
	for _, c := range counts {
		p := float64(c) / float64(n)
		h -= p * math.Log2(p)
	}
	if h < 3 {
		return fmt.Errorf("token entropy %.1f bits per character is too low: %w", h, ErrWeakToken)
	}
	return nil
}

// TenantOf derives the tenant id from a token: the first 12 hex digits of
// its SHA-256, as the Python server did, so workspace paths and database
// rows stay where they were and no token is ever stored.
func TenantOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])[:12]
}

// authenticator checks bearer tokens (in constant time, package bearer)
// and names the tenant a token belongs to.
type authenticator struct {
	tokens *bearer.Tokens
}

func newAuthenticator(tokens []string) *authenticator {
	return &authenticator{tokens: bearer.New(tokens)}
}

// check reports whether the Authorization header value carries a valid
// bearer token, and the tenant it belongs to.
func (a *authenticator) check(header string) (tenant string, ok bool) {
	token, ok := a.tokens.Match(header)
	if !ok {
		return "", false
	}
	return TenantOf(token), true
}
