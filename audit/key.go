package audit

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Key errors; test with errors.Is.
var (
	// ErrKeyRequired: the log (or its head record) is keyed, and Verify was
	// given no key or a different one, so the chain cannot be checked.
	ErrKeyRequired = errors.New("audit log is keyed; verifying it needs its key")
	// ErrBadKey: a configured key file or variable does not hold a key.
	ErrBadKey = errors.New("audit key is not valid")
)

// The environment variables that name the chain key, in the order
// LoadKey looks at them.
const (
	// KeyFileEnv names a file holding the key (hex, as KeyGen writes it).
	KeyFileEnv = "PULSE_AUDIT_KEY_FILE"
	// KeyEnv holds the key itself, hex encoded.
	KeyEnv = "PULSE_AUDIT_KEY"
)

// MinKeyLen is the shortest key accepted, in bytes.
const MinKeyLen = 32

// Key is the secret the keyed chain is computed with. Keep it outside the
// workspace (and out of the sandbox's reach): whoever holds it can rewrite
// the log undetectably.
type Key struct {
	secret []byte
	id     string
	// Source says where the key came from (a file path or a variable
	// name), for messages; it is never the key.
	Source string
}

// NewKey wraps secret (at least MinKeyLen bytes) as a Key.
func NewKey(secret []byte, source string) (*Key, error) {
	if len(secret) < MinKeyLen {
		return nil, fmt.Errorf("%w: %d bytes, want at least %d", ErrBadKey, len(secret), MinKeyLen)
	}
	s := append([]byte(nil), secret...)
	// The id names the key in every line without revealing it: a hash
	// under a label nothing else hashes.
	m := hmac.New(sha256.New, s)
	io.WriteString(m, "pulse audit key id")
	return &Key{secret: s, id: hex.EncodeToString(m.Sum(nil))[:16], Source: source}, nil
}

// ID is the 16 hex digits that name the key in key_id.
func (k *Key) ID() string { return k.id }

func (k *Key) String() string { return "audit key " + k.id + " from " + k.Source }

// ParseKey decodes a key as KeyGen writes it: hex digits, surrounding
// white space ignored.
func ParseKey(text []byte, source string) (*Key, error) {
	b, err := hex.DecodeString(string(bytes.TrimSpace(text)))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: not hex", ErrBadKey, source)
	}
	return NewKey(b, source)
}

// DefaultKeyFile is where LoadKey looks when no variable names a key:
// $XDG_CONFIG_HOME/pulse/audit.key, or ~/.config/pulse/audit.key. getenv
// is os.Getenv in a program. It returns "" when neither variable is set.
func DefaultKeyFile(getenv func(string) string) string {
	if d := getenv("XDG_CONFIG_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "pulse", "audit.key")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "pulse", "audit.key")
	}
	return ""
}

// LoadKey finds the chain key the operator configured: the file named by
// PULSE_AUDIT_KEY_FILE, else the hex in PULSE_AUDIT_KEY, else
// DefaultKeyFile if it exists. It returns nil, nil when none is
// configured (the chain is then unkeyed). A key that is named but cannot
// be read or is not valid is an error: a configured key is never silently
// dropped.
func LoadKey(getenv func(string) string) (*Key, error) {
	if p := getenv(KeyFileEnv); p != "" {
		return ReadKeyFile(p)
	}
	if v := getenv(KeyEnv); v != "" {
		return ParseKey([]byte(v), "$"+KeyEnv)
	}
	p := DefaultKeyFile(getenv)
	if p == "" {
		return nil, nil
	}
	k, err := ReadKeyFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return k, err
}

// ReadKeyFile reads a key file as KeyGen writes it.
func ReadKeyFile(path string) (*Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit: key file: %w", err)
	}
	return ParseKey(b, path)
}

// KeyGen creates a new random key in path (mode 0600, its directory 0700
// if made), refusing to overwrite one that exists.
func KeyGen(path string) (*Key, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit: key directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: key file: %w", err)
	}
	_, err = io.WriteString(f, hex.EncodeToString(secret)+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("audit: key file: %w", err)
	}
	syncDir(filepath.Dir(path))
	return NewKey(secret, path)
}

// Inside reports whether the key's source is a file inside dir: a key a
// sandboxed command could read is no key.
func (k *Key) Inside(dir string) bool {
	if k == nil || strings.HasPrefix(k.Source, "$") {
		return false
	}
	abs, err := filepath.Abs(k.Source)
	if err != nil {
		return true
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	d, err := filepath.Abs(dir)
	if err != nil {
		return true
	}
	if r, err := filepath.EvalSymlinks(d); err == nil {
		d = r
	}
	rel, err := filepath.Rel(d, abs)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// mac is hex(HMAC-SHA256(key, prev_hash || canonical)): the keyed chain.
func (k *Key) mac(prev string, canonical []byte) string {
	m := hmac.New(sha256.New, k.secret)
	io.WriteString(m, prev)
	m.Write(canonical)
	return hex.EncodeToString(m.Sum(nil))
}
