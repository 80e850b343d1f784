package daemon

import (
	"bytes"
	"encoding/json"
	"testing"
)

// appendRequest writes what json.Marshal writes: the daemon decodes it
// with encoding/json, and a request that differed would be another
// request (or none).
func TestAppendRequestIsJSONMarshal(t *testing.T) {
	for _, r := range []Request{
		{V: Version, Op: OpRun, Args: []string{"exec", "--", "true"}, Prog: "pulse", Dir: "/w", Env: []string{"A=1", "PATH=/bin"}},
		{V: Version, Op: OpStatus, Dir: "/"},
		{V: -3, Op: "", Dir: ""},
		{V: Version, Op: OpRun, Args: []string{"sh", "-c", "echo \"$A\" \\ <b> & 'x'\n\t\r\b\f\x00\x1f\x7f"}, Dir: "/w"},
		{V: Version, Op: OpRun, Args: []string{"\xff\xfe", "a\xc3", "\u2028\u2029", "héllo 世界 🎉"}, Dir: "/\xe2\x80"},
	} {
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRequest(nil, &r); !bytes.Equal(got, want) {
			t.Errorf("appendRequest(%+v)\n got %s\nwant %s", r, got, want)
		}
	}
}

func FuzzAppendRequest(f *testing.F) {
	f.Add("exec", "/w", "A=1", "pulse")
	f.Add("<&>\u2028", "\x00\xff", "\"\\", "\u2029\xe2\x80")
	f.Fuzz(func(t *testing.T, arg, dir, env, prog string) {
		r := Request{V: Version, Op: OpRun, Args: []string{arg, arg + dir}, Prog: prog, Dir: dir, Env: []string{env}}
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRequest(nil, &r); !bytes.Equal(got, want) {
			t.Fatalf("appendRequest\n got %q\nwant %q", got, want)
		}
	})
}
