package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestParseMessage(t *testing.T) {
	m, err := ParseMessage([]byte(`{"action":"status","payload":{"execution_id":"e1","request_id":"req-1"}}`))
	if err != nil || m.Action != "status" || m.RequestID != "req-1" {
		t.Fatalf("%+v, %v", m, err)
	}
	if id, err := m.ExecutionID(); err != nil || id != "e1" {
		t.Fatalf("ExecutionID = %q, %v", id, err)
	}
	m, err = ParseMessage([]byte(`{"action":"reconcile"}`))
	if err != nil || len(m.Payload) != 0 || m.RequestID != "" {
		t.Fatalf("no payload: %+v, %v", m, err)
	}
	for _, bad := range []string{``, `null`, `[]`, `"x"`, `{"action":1}`, `{"action":"a","payload":[]}`, `{"action":"a","payload":null}`, `{"action":"a","payload":"s"}`} {
		if _, err := ParseMessage([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: err = %v, want ErrInvalid", bad, err)
		}
	}
	for id, ok := range map[string]bool{"a": true, "A.b_c-9": true, strings.Repeat("a", 128): true,
		strings.Repeat("a", 129): false, "": false, "-a": false, ".a": false, "a b": false, "a/b": false, "é": false} {
		if ValidID(id) != ok {
			t.Errorf("ValidID(%q) = %v", id, !ok)
		}
	}
}

func TestParseSubmit(t *testing.T) {
	parse := func(s string) (*SubmitRequest, error) {
		var p map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &p); err != nil {
			t.Fatal(err)
		}
		return ParseSubmit(p)
	}
	r, err := parse(`{"execution_id":"e","command":"ls -l","correlation_id":"c","timeout_s":1.5,"env":{"A_1":"v"},"cwd":"./src//x/","encoding":"base64","network":{"mode":"allow-all"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if r.Shell != "ls -l" || r.CorrelationID != "c" || r.Timeout != 1500*time.Millisecond || r.Env["A_1"] != "v" ||
		r.Cwd != "src/x" || r.Encoding != "base64" || r.Network == nil || r.Network.Mode != "allow-all" {
		t.Fatalf("%+v", r)
	}
	r, err = parse(`{"execution_id":"e","command":["echo","a b"],"encoding":"text","cwd":null,"requires":["git","python3"]}`)
	if err != nil || len(r.Args) != 2 || r.Encoding != "" || r.Cwd != "" || len(r.Requires) != 2 {
		t.Fatalf("%+v, %v", r, err)
	}
	for _, bad := range []string{
		`{"command":"x"}`,
		`{"execution_id":"e"}`,
		`{"execution_id":"e","command":"  "}`,
		`{"execution_id":"e","command":[]}`,
		`{"execution_id":"e","command":[""]}`,
		`{"execution_id":"e","command":[1]}`,
		`{"execution_id":"e","command":"x","timeout_s":0}`,
		`{"execution_id":"e","command":"x","timeout_s":"5"}`,
		`{"execution_id":"e","command":"x","timeout_s":1e9}`,
		`{"execution_id":"e","command":"x","env":{"1A":"v"}}`,
		`{"execution_id":"e","command":"x","env":["A"]}`,
		`{"execution_id":"e","command":"x","cwd":"/etc"}`,
		`{"execution_id":"e","command":"x","cwd":"a/../../b"}`,
		`{"execution_id":"e","command":"x","cwd":".pulse/x"}`,
		`{"execution_id":"e","command":"x","cwd":"a\\b"}`,
		`{"execution_id":"e","command":"x","encoding":"hex"}`,
		`{"execution_id":"e","command":"x","network":{"mode":"open"}}`,
		`{"execution_id":"e","command":"x","network":{"mode":"deny-all","extra":1}}`,
		`{"execution_id":"e","command":"x","secrets":{"mode":"some"}}`,
		`{"execution_id":"e","command":"x","network":{"allow":["x"]}}`,
		`{"execution_id":"e","command":"x","secrets":{"mode":"deny-all","extra":1}}`,
		`{"execution_id":"e","command":"x","limits":{"memory":1}}`,
		`{"execution_id":"e","command":"x","correlation_id":7}`,
		`{"execution_id":"e","command":"x","requires":"git"}`,
		`{"execution_id":"e","command":"x","requires":["a b"]}`,
	} {
		if _, err := parse(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", bad, err)
		}
	}
}

// FuzzMessage feeds arbitrary frames to the parsers: they must not panic,
// and what they accept must satisfy the protocol's invariants.
func FuzzMessage(f *testing.F) {
	for _, s := range []string{
		`{"action":"submit","payload":{"execution_id":"e","command":"ls","cwd":"a/b","env":{"A":"b"},"timeout_s":3,"request_id":"r"}}`,
		`{"action":"submit","payload":{"execution_id":"e","command":["a","b"],"network":{"mode":"allowlist","hosts":["x"]}}}`,
		`{"action":"attach","payload":{"execution_id":"e","after_seq":4}}`,
		`{"action":"status"}`, `[]`, `{"action":null}`, `{"action":"x","payload":{"request_id":"../x"}}`,
		`{"action":"submit","payload":{"execution_id":"e","command":"x","cwd":"../../.."}}`,
		`{"action":"submit","payload":{"execution_id":"e","command":"sh","process":true,"tty":{"rows":24,"cols":80}}}`,
		`{"action":"signal","payload":{"execution_id":"e","signal":"TERM"}}`,
		`{"action":"stdin","payload":{"execution_id":"e","offset":3,"data":"aGk=","eof":true}}`,
		`{"action":"resize","payload":{"execution_id":"e","rows":30,"cols":100}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMessage(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if m.RequestID != "" && !ValidID(m.RequestID) {
			t.Fatalf("invalid request id accepted: %q", m.RequestID)
		}
		if id, err := m.ExecutionID(); err == nil && !ValidID(id) {
			t.Fatalf("invalid execution id accepted: %q", id)
		}
		if sr, err := ParseSignal(m.Payload); err == nil {
			if name, ok := SignalName(sr.Signal); !ok || Signals[name] != sr.Signal || !ValidID(sr.ExecutionID) {
				t.Fatalf("signal accepted: %+v", sr)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("signal error %v does not wrap ErrInvalid", err)
		}
		if in, err := ParseStdin(m.Payload); err == nil {
			if in.Offset < 0 || len(in.Data) > MaxStdinChunk || !ValidID(in.ExecutionID) {
				t.Fatalf("stdin accepted: offset %d, %d bytes", in.Offset, len(in.Data))
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("stdin error %v does not wrap ErrInvalid", err)
		}
		if rs, err := ParseResize(m.Payload); err == nil {
			if rs.Rows == 0 || rs.Cols == 0 || !ValidID(rs.ExecutionID) {
				t.Fatalf("resize accepted: %+v", rs)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("resize error %v does not wrap ErrInvalid", err)
		}
		r, err := ParseSubmit(m.Payload)
		if err != nil {
			return
		}
		if r.TTY != nil && (!r.Process || r.TTY.Rows == 0 || r.TTY.Cols == 0) || r.Process && r.Stdin != nil {
			t.Fatalf("process submit accepted: %+v", r)
		}
		if !ValidID(r.ExecutionID) || (r.Shell == "") == (len(r.Args) == 0) {
			t.Fatalf("bad submit accepted: %+v", r)
		}
		if strings.HasPrefix(r.Cwd, "/") || r.Cwd == ".." || strings.HasPrefix(r.Cwd, "../") || strings.Contains(r.Cwd, "/../") {
			t.Fatalf("cwd escapes: %q", r.Cwd)
		}
		if r.Timeout < 0 || r.Timeout > MaxTimeout {
			t.Fatalf("timeout out of range: %v", r.Timeout)
		}
		for k := range r.Env {
			if !ValidEnvName(k) {
				t.Fatalf("env name accepted: %q", k)
			}
		}
		// Replies built from accepted input are valid JSON and UTF-8.
		out := ResponseFrame(m.RequestID, StatusStarting, map[string]any{"execution_id": r.ExecutionID})
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("reply is not valid JSON: %q", out)
		}
	})
}
