// Package bearer checks "Authorization: Bearer <token>" headers against a
// fixed set of tokens in constant time. The server's client API and the
// worker relay both accept their callers this way.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"strings"
)

// Tokens is a set of accepted tokens, kept as SHA-256 digests.
type Tokens struct {
	hashes [][sha256.Size]byte
}

// New returns the set of tokens.
func New(tokens []string) *Tokens {
	t := &Tokens{}
	for _, tok := range tokens {
		t.hashes = append(t.hashes, sha256.Sum256([]byte(tok)))
	}
	return t
}

// Match reports whether the Authorization header value carries one of the
// tokens, and returns it. Comparing fixed-length digests of every token,
// without stopping at the first match, keeps the time independent of the
// token's length and of which token matched.
func (t *Tokens) Match(header string) (token string, ok bool) {
	token, found := strings.CutPrefix(header, "Bearer ")
	if !found || token == "" {
		return "", false
	}
	h := sha256.Sum256([]byte(token))
	match := 0
	for i := range t.hashes {
		match |= subtle.ConstantTimeCompare(h[:], t.hashes[i][:])
	}
	if match != 1 {
		return "", false
	}
	return token, true
}
