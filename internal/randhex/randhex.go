// Package randhex makes the random names the project gives what it
// creates (transaction, execution and session ids, temporary files and
// directories, nonces, tokens): n bytes of crypto/rand, spelled in
// lower-case hex, so that they are safe in paths, container names and
// headers alike. It is a leaf: it imports only the standard library, so
// public packages may use it.
package randhex

import (
	"crypto/rand"
	"encoding/hex"
)

// String returns n random bytes as 2n lower-case hex digits. It cannot
// fail: since Go 1.24, crypto/rand.Read never returns an error (where the
// system's source fails, it ends the program instead), so no caller has
// an error to handle or a predictable name to fall back to.
func String(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
