package boxrt

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	for _, c := range []struct {
		in   string
		kind string
		args []string
	}{
		{"exec\x00a1\x00/w\x00", "exec", []string{"a1", "/w"}},
		{"exec\x00with space\x00'quote\x00\n\x00", "exec", []string{"with space", "'quote", "\n"}},
		{"sync\x00a1\x00", "sync", []string{"a1"}},
		{"sync\x00", "sync", []string{}},
	} {
		kind, args, err := parseRequest([]byte(c.in))
		if err != nil || kind != c.kind || !slices.Equal(args, c.args) {
			t.Errorf("parseRequest(%q) = %q %q %v; want %q %q", c.in, kind, args, err, c.kind, c.args)
		}
	}
	for _, in := range []string{"", "exec", "exec\x00a", "exec\x00", "run\x00x\x00", "EXEC\x00x\x00", "exit 0\n", "\x00exec\x00", strings.Repeat("x", maxRequest) + "\x00\x00"} {
		if kind, args, err := parseRequest([]byte(in)); !errors.Is(err, errRequest) {
			t.Errorf("parseRequest(%.40q) = %q %q %v; want errRequest", in, kind, args, err)
		}
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{"0123456789abcdef": true, "a": true, "": false, "../x": false, "ABC": false, "a b": false, strings.Repeat("a", 65): false} {
		if validID(id) != want {
			t.Errorf("validID(%q) = %v", id, !want)
		}
	}
}

// The request file is written by the host, but a channel directory is a
// place other code can reach: whatever it holds, parsing never panics, and
// what it accepts is one of the two kinds, with the exec kind never empty.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte("exec\x00a1\x00/w\x00"))
	f.Add([]byte("sync\x00a1\x00"))
	f.Add([]byte("exit 0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, args, err := parseRequest(b)
		if err != nil {
			return
		}
		if kind != "exec" && kind != "sync" || kind == "exec" && len(args) == 0 {
			t.Fatalf("accepted %q: %q %q", b, kind, args)
		}
		for _, a := range args {
			if strings.IndexByte(a, 0) >= 0 {
				t.Fatalf("an argument holds a NUL: %q", a)
			}
		}
	})
}
