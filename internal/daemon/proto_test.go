package daemon

import (
	"errors"
	"testing"
)

func TestDecodeRequest(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"run", `{"v":1,"op":"run","args":["exec","--","true"],"dir":"/w","env":["A=1"]}`, true},
		{"status", `{"v":1,"op":"status","dir":"/w"}`, true},
		{"old version", `{"v":0,"op":"run","args":["exec"],"dir":"/w"}`, false},
		{"no args", `{"v":1,"op":"run","dir":"/w"}`, false},
		{"relative dir", `{"v":1,"op":"run","args":["exec"],"dir":"w"}`, false},
		{"env without =", `{"v":1,"op":"run","args":["exec"],"dir":"/w","env":["A"]}`, false},
		{"env without name", `{"v":1,"op":"run","args":["exec"],"dir":"/w","env":["=1"]}`, false},
		{"NUL in argument", `{"v":1,"op":"run","args":["ex\u0000ec"],"dir":"/w"}`, false},
		{"unknown op", `{"v":1,"op":"shell","dir":"/w"}`, false},
		{"not JSON", `{"v":1,`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeRequest([]byte(tc.in))
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadRequest)) {
				t.Fatalf("DecodeRequest(%s) = %v, want ok=%v", tc.in, err, tc.ok)
			}
		})
	}
}

// A request comes from a process of the same user, but one the daemon
// does not otherwise trust: whatever it sends is refused or decoded,
// never a panic.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"run","args":["exec","--","true"],"dir":"/w","env":["A=1"]}`))
	f.Add([]byte(`{"v":1,"op":"stop","dir":"/"}`))
	f.Add([]byte(`{"v":1,"op":"run","args":[""],"dir":"/\u0000"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil {
			return
		}
		if r.V != Version || r.Dir == "" || r.Dir[0] != '/' {
			t.Fatalf("accepted %+v", r)
		}
		if r.Op == OpRun && len(r.Args) == 0 {
			t.Fatalf("accepted a run without arguments")
		}
	})
}
