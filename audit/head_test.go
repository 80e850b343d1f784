package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testKey(t *testing.T, b byte) *Key {
	t.Helper()
	k, err := NewKey(bytes.Repeat([]byte{b}, 32), "test")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestHeadShowsACutTail is issue 13 item 9: cutting lines off the end of
// the log, emptying it or removing it is reported without an anchor, and
// appending on afterwards does not hide it.
func TestHeadShowsACutTail(t *testing.T) {
	cases := []struct {
		name    string
		cut     func(t *testing.T, path string)
		wantBad uint64
	}{
		{"last two lines", func(t *testing.T, path string) { writeLines(t, path, readLines(t, path)[:3]) }, 4},
		{"emptied", func(t *testing.T, path string) { os.Truncate(path, 0) }, 1},
		{"removed", func(t *testing.T, path string) { os.Remove(path) }, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			writeEvents(t, path, 5)
			if rep, err := Verify(t.Context(), path); err != nil || !rep.Head || rep.HeadSeq != 5 {
				t.Fatalf("intact: %+v %v", rep, err)
			}
			c.cut(t, path)
			rep, err := Verify(t.Context(), path)
			if !errors.Is(err, ErrTruncated) || rep.BadSeq != c.wantBad {
				t.Fatalf("after cut: %+v %v, want ErrTruncated at seq %d", rep, err, c.wantBad)
			}
			// The next writer records the break in the chain, so the head
			// it then writes does not bless the shorter log.
			writeEvents(t, path, 2)
			rep, err = Verify(t.Context(), path)
			if !errors.Is(err, ErrTruncated) || rep.BadSeq != c.wantBad {
				t.Fatalf("after appending on: %+v %v, want ErrTruncated at seq %d", rep, err, c.wantBad)
			}
			evs := readEvents(t, path)
			if evs[c.wantBad-1].Action != ActionHeadMismatch || !strings.Contains(evs[c.wantBad-1].Detail, "seq 5") {
				t.Fatalf("event at seq %d: %+v", c.wantBad, evs[c.wantBad-1])
			}
		})
	}
}

// A log written before head records existed (or a head lost in an
// unkeyed log) gets one from the next append and verifies.
func TestUnkeyedLogWithoutHeadStillVerifies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 3)
	os.Remove(path + HeadSuffix)
	if rep, err := Verify(t.Context(), path); err != nil || rep.Head {
		t.Fatalf("no head: %+v %v", rep, err)
	}
	writeEvents(t, path, 1)
	if rep, err := Verify(t.Context(), path); err != nil || !rep.Head || rep.HeadSeq != 4 || rep.Events != 4 {
		t.Fatalf("head recreated: %+v %v", rep, err)
	}
}

func TestHeadBehindTheLogIsAccepted(t *testing.T) {
	// A writer killed between its line and its head update.
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 2)
	old, _ := os.ReadFile(path + HeadSuffix)
	writeEvents(t, path, 2)
	os.WriteFile(path+HeadSuffix, old, 0o600)
	if rep, err := Verify(t.Context(), path); err != nil || rep.HeadSeq != 2 || rep.LastSeq != 4 {
		t.Fatalf("%+v %v", rep, err)
	}
	writeEvents(t, path, 1)
	if rep, err := Verify(t.Context(), path); err != nil || rep.HeadSeq != 5 {
		t.Fatalf("%+v %v", rep, err)
	}
}

func TestHeadRewrittenLastLine(t *testing.T) {
	// The last line replaced by a fresh, well-chained one: the chain
	// alone cannot see it, the head can.
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 3)
	lines := readLines(t, path)
	prev, _ := ParseLine(lines[1])
	e, _ := ParseLine(lines[2])
	e.Target = "rm -rf /"
	e.PrevHash = prev.Hash
	canon, _ := e.canonical()
	forged := string(canon[:len(canon)-1]) + hashKey + chainHash(prev.Hash, canon) + "\"}"
	writeLines(t, path, [][]byte{lines[0], lines[1], []byte(forged)})
	if _, err := Verify(t.Context(), path); !errors.Is(err, ErrTampered) || !strings.Contains(err.Error(), "head record") {
		t.Fatalf("forged last line: %v", err)
	}
}

func TestKeyedChain(t *testing.T) {
	k := testKey(t, 7)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 2)             // before a key was configured
	writeEvents(t, path, 3, WithKey(k)) // then keyed
	rep, err := Verify(t.Context(), path, VerifyKey(k))
	if err != nil || rep.KeyID != k.ID() || rep.UnkeyedEvents != 2 || rep.Events != 5 {
		t.Fatalf("keyed: %+v %v", rep, err)
	}
	for i, e := range readEvents(t, path) {
		if (i >= 2) != (e.KeyID == k.ID()) {
			t.Fatalf("event %d key_id %q", i+1, e.KeyID)
		}
	}
	if _, err := Verify(t.Context(), path); !errors.Is(err, ErrKeyRequired) {
		t.Fatalf("without the key: %v", err)
	}
	if _, err := Verify(t.Context(), path, VerifyKey(testKey(t, 8))); !errors.Is(err, ErrKeyRequired) {
		t.Fatalf("with another key: %v", err)
	}
	// A writer without the key (or with another) refuses to append: it
	// would break the chain for good.
	if l, err := Open(t.Context(), path); !errors.Is(err, ErrKeyRequired) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("open without the key: %v", err)
	}
	if _, err := Open(t.Context(), path, WithKey(testKey(t, 8))); !errors.Is(err, ErrKeyRequired) {
		t.Fatalf("open with another key: %v", err)
	}
}

// TestKeyedChainResistsRewriting: without the key, neither a line nor
// the head can be made to match a changed or cut log.
func TestKeyedChainResistsRewriting(t *testing.T) {
	k := testKey(t, 7)
	setup := func(t *testing.T) string {
		path := filepath.Join(t.TempDir(), "audit.jsonl")
		writeEvents(t, path, 4, WithKey(k))
		return path
	}
	t.Run("line recomputed with SHA-256", func(t *testing.T) {
		path := setup(t)
		lines := readLines(t, path)
		prev, _ := ParseLine(lines[2])
		e, _ := ParseLine(lines[3])
		e.Target = "something else"
		canon, _ := e.canonical()
		lines[3] = []byte(string(canon[:len(canon)-1]) + hashKey + chainHash(prev.Hash, canon) + "\"}")
		writeLines(t, path, lines)
		if rep, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTampered) || rep.BadSeq != 4 {
			t.Fatalf("%+v %v", rep, err)
		}
	})
	t.Run("downgraded to unkeyed lines", func(t *testing.T) {
		path := setup(t)
		lines := readLines(t, path)
		prev, _ := ParseLine(lines[2])
		e, _ := ParseLine(lines[3])
		e.KeyID = ""
		canon, _ := e.canonical()
		lines[3] = []byte(string(canon[:len(canon)-1]) + hashKey + chainHash(prev.Hash, canon) + "\"}")
		writeLines(t, path, lines)
		if rep, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTampered) || rep.BadSeq != 4 {
			t.Fatalf("%+v %v", rep, err)
		}
	})
	t.Run("cut, head rewritten unkeyed", func(t *testing.T) {
		path := setup(t)
		lines := readLines(t, path)
		writeLines(t, path, lines[:2])
		last, _ := ParseLine(lines[1])
		os.WriteFile(path+HeadSuffix, encodeHead(nil, 2, last.Hash), 0o600)
		if _, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTampered) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("cut, head forged under another key", func(t *testing.T) {
		path := setup(t)
		lines := readLines(t, path)
		writeLines(t, path, lines[:2])
		last, _ := ParseLine(lines[1])
		os.WriteFile(path+HeadSuffix, encodeHead(testKey(t, 9), 2, last.Hash), 0o600)
		if _, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrKeyRequired) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("cut, head edited", func(t *testing.T) {
		path := setup(t)
		lines := readLines(t, path)
		writeLines(t, path, lines[:2])
		last, _ := ParseLine(lines[1])
		h, _ := os.ReadFile(path + HeadSuffix)
		h = bytes.Replace(h, []byte(`"seq":4`), []byte(`"seq":2`), 1)
		var cur head
		cur, _ = decodeHead(encodeHead(k, 4, last.Hash), k)
		h = bytes.Replace(h, []byte(cur.Hash), []byte(last.Hash), 1)
		os.WriteFile(path+HeadSuffix, h, 0o600)
		if _, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTampered) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("head removed", func(t *testing.T) {
		path := setup(t)
		os.Remove(path + HeadSuffix)
		if _, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTampered) {
			t.Fatalf("%v", err)
		}
		// ...and the next keyed writer says so in the chain.
		writeEvents(t, path, 1, WithKey(k))
		if rep, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTruncated) || rep.BadSeq != 5 {
			t.Fatalf("%+v %v", rep, err)
		}
	})
}

// TestKeyedHashRuleAsDocumented recomputes a keyed line's hash by the
// rule SCHEMA.md gives.
func TestKeyedHashRuleAsDocumented(t *testing.T) {
	k := testKey(t, 3)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 1, WithKey(k))
	line := readLines(t, path)[0]
	line = bytes.TrimSuffix(line, []byte("\n"))
	i := bytes.LastIndex(line, []byte(`,"hash":"`))
	canon := append(append([]byte(nil), line[:i]...), '}')
	e, _ := ParseLine(line)
	if got := k.mac(GenesisHash, canon); got != e.Hash {
		t.Fatalf("hash %s, HMAC rule gives %s", e.Hash, got)
	}
	plain := sha256.Sum256(append([]byte(GenesisHash), canon...))
	if hex.EncodeToString(plain[:]) == e.Hash {
		t.Fatal("a keyed line carries the plain SHA-256")
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"HOME": dir}
	getenv := func(k string) string { return env[k] }
	if k, err := LoadKey(getenv); k != nil || err != nil {
		t.Fatalf("nothing configured: %v %v", k, err)
	}
	def := DefaultKeyFile(getenv)
	if def != filepath.Join(dir, ".config", "pulse", "audit.key") {
		t.Fatalf("default key file %s", def)
	}
	gen, err := KeyGen(def)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(def); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", st.Mode())
	}
	if _, err := KeyGen(def); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second keygen: %v", err)
	}
	if k, err := LoadKey(getenv); err != nil || k.ID() != gen.ID() {
		t.Fatalf("default file: %v %v", k, err)
	}
	env[KeyEnv] = strings.Repeat("ab", 32)
	if k, err := LoadKey(getenv); err != nil || k.ID() == gen.ID() || k.Source != "$"+KeyEnv {
		t.Fatalf("variable: %v %v", k, err)
	}
	env[KeyFileEnv] = filepath.Join(dir, "missing")
	if _, err := LoadKey(getenv); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("named file missing: %v", err)
	}
	os.WriteFile(env[KeyFileEnv], []byte("short\n"), 0o600)
	if _, err := LoadKey(getenv); !errors.Is(err, ErrBadKey) {
		t.Fatalf("bad key: %v", err)
	}
	if !gen.Inside(dir) || gen.Inside(filepath.Join(dir, "ws")) {
		t.Fatal("Inside")
	}
	if strings.Contains(gen.String(), hex.EncodeToString(gen.secret)) {
		t.Fatal("String shows the key")
	}
}

// FuzzDecodeHead: a head record is read from a directory others may
// write; decoding never panics, and only a record whose sum matches is
// accepted.
func FuzzDecodeHead(f *testing.F) {
	k, _ := NewKey(bytes.Repeat([]byte{1}, 32), "fuzz")
	f.Add(encodeHead(nil, 3, GenesisHash))
	f.Add(encodeHead(k, 9, GenesisHash))
	f.Add([]byte(`{"v":1,"seq":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, key := range []*Key{nil, k} {
			h, err := decodeHead(b, key)
			if err != nil {
				continue
			}
			var want *Key
			if h.KeyID != "" {
				want = key
			}
			if h.Sum != headSum(want, h.Seq, h.Hash) {
				t.Fatalf("accepted a head whose sum does not match: %q", b)
			}
		}
	})
}
