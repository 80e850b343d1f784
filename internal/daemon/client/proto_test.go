package client

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

// reply is package daemon's Reply as the daemon marshals it.
type reply struct {
	Accepted bool   `json:"accepted,omitempty"`
	Refused  string `json:"refused,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	Exit     *int   `json:"exit,omitempty"`
	Status   *struct {
		Pid  int    `json:"pid"`
		Dir  string `json:"dir"`
		Idle string `json:"idle"`
	} `json:"status,omitempty"`
}

func TestParseReply(t *testing.T) {
	seven := 7
	for _, tc := range []struct {
		in   string
		want Reply
		ok   bool
	}{
		{`{"accepted":true,"pid":42}`, Reply{Accepted: true, Pid: 42}, true},
		{`{"exit":7}`, Reply{Exit: &seven}, true},
		{` { "refused" : "a \"b\" \u003cc\u003e \ud83c\udf89 \ud800 é\n" } `, Reply{Refused: "a \"b\" <c> 🎉 \ufffd é\n"}, true},
		{`{"status":{"pid":1,"dir":"/w","x":[1,2.5e3,{"y":null}]},"accepted":false}`, Reply{}, true},
		{`{"exit":null}`, Reply{}, true},
		{`{}`, Reply{}, true},
		{`{"exit":1.5}`, Reply{}, false},
		{`{"exit":07}`, Reply{}, false},
		{`{"accepted":1}`, Reply{}, false},
		{`{"refused":"a`, Reply{}, false},
		{`{"pid":1,}`, Reply{}, false},
		{`{"pid":1} x`, Reply{}, false},
		{`[]`, Reply{}, false},
		{"{\"refused\":\"a\x01\"}", Reply{}, false},
	} {
		got, err := parseReply([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("parseReply(%s): %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok && (got.Accepted != tc.want.Accepted || got.Refused != tc.want.Refused || got.Pid != tc.want.Pid ||
			(got.Exit == nil) != (tc.want.Exit == nil) || (got.Exit != nil && *got.Exit != *tc.want.Exit)) {
			t.Errorf("parseReply(%s) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// What the daemon writes, parseReply reads back; anything else is
// refused or read, never a panic.
func FuzzParseReply(f *testing.F) {
	f.Add(true, "", 42, 0, false, []byte(`{"accepted":true,"pid":42}`))
	f.Add(false, "a \"b\" <c>\u2028\xff", 0, 7, true, []byte(`{"status":{"x":[[[]]]}}`))
	f.Fuzz(func(t *testing.T, accepted bool, refused string, pid, exit int, hasExit bool, raw []byte) {
		_, _ = parseReply(raw)
		r := reply{Accepted: accepted, Refused: refused, Pid: pid}
		if hasExit {
			r.Exit = &exit
		}
		data, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		var want reply
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got, err := parseReply(data)
		if err != nil {
			t.Fatalf("parseReply(%s): %v", data, err)
		}
		if got.Accepted != want.Accepted || got.Refused != want.Refused || got.Pid != want.Pid ||
			(got.Exit == nil) != (want.Exit == nil) || (got.Exit != nil && *got.Exit != *want.Exit) {
			t.Fatalf("parseReply(%s) = %+v, want %+v", data, got, want)
		}
	})
}
