package protocol

import (
	"errors"
	"testing"
)

// FuzzParseFrame: any server frame either parses into exactly one known
// kind or is refused as ErrFrame; it never panics.
func FuzzParseFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"response","payload":{"status":"STARTING","request_id":"r1","execution_id":"e"}}`,
		`{"type":"error","payload":{"message":"NOT_FOUND","request_id":null,"code":"NOT_FOUND"}}`,
		`{"type":"stream","payload":{"execution_id":"e","stream":"stdout","data":"aGk=","seq":3,"encoding":"base64"}}`,
		`{"type":"stream","payload":{"execution_id":"e","stream":"stderr","data":"text"}}`,
		`{"type":"result","payload":{"execution_id":"e","exit_code":0,"termination_reason":"exited","pid":null}}`,
		`{"type":"response","payload":{"status":"CAPABILITIES","capabilities":{"isolation":"namespace","network":{"deny-all":"strong"}}}}`,
		`{"type":"stream","payload":null}`, `[]`, `null`, `{"type":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := ParseFrame(data)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v is not ErrFrame", err)
			}
			return
		}
		n := 0
		for _, set := range []bool{fr.Reply != nil, fr.Stream != nil, fr.Result != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("frame %q decoded into %d kinds", data, n)
		}
		if fr.Stream != nil && (fr.Stream.Stream != "stdout" && fr.Stream.Stream != "stderr" || fr.Stream.Seq < 0) {
			t.Fatalf("accepted stream event %+v", fr.Stream)
		}
	})
}
