package protocol

import (
	"encoding/json"
	"errors"
	"syscall"
	"testing"
)

func payload(t *testing.T, s string) map[string]json.RawMessage {
	t.Helper()
	m, err := ParseMessage([]byte(`{"action":"x","payload":` + s + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return m.Payload
}

func TestParseProcessRequests(t *testing.T) {
	sr, err := ParseSignal(payload(t, `{"execution_id":"e","signal":"SIGUSR1"}`))
	if err != nil || sr.Signal != syscall.SIGUSR1 || sr.ExecutionID != "e" {
		t.Fatalf("signal: %+v %v", sr, err)
	}
	in, err := ParseStdin(payload(t, `{"execution_id":"e","offset":2,"data":"aGk=","eof":true}`))
	if err != nil || in.Offset != 2 || string(in.Data) != "hi" || !in.EOF {
		t.Fatalf("stdin: %+v %v", in, err)
	}
	rs, err := ParseResize(payload(t, `{"execution_id":"e","rows":30,"cols":100}`))
	if err != nil || rs.Rows != 30 || rs.Cols != 100 {
		t.Fatalf("resize: %+v %v", rs, err)
	}
	sub, err := ParseSubmit(payload(t, `{"execution_id":"e","command":"sh","process":true,"tty":{"rows":24,"cols":80}}`))
	if err != nil || !sub.Process || sub.TTY == nil || *sub.TTY != (TTYSize{24, 80}) {
		t.Fatalf("submit: %+v %v", sub, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := ParseSignal(payload(t, `{"execution_id":"e","signal":"SEGV"}`)); return err },
		func() error { _, err := ParseSignal(payload(t, `{"execution_id":"e","signal":9}`)); return err },
		func() error { _, err := ParseStdin(payload(t, `{"execution_id":"e","offset":-1}`)); return err },
		func() error { _, err := ParseStdin(payload(t, `{"execution_id":"e"}`)); return err },
		func() error {
			_, err := ParseStdin(payload(t, `{"execution_id":"e","offset":0,"data":"aGk"}`))
			return err
		},
		func() error { _, err := ParseResize(payload(t, `{"execution_id":"e","rows":0,"cols":80}`)); return err },
		func() error {
			_, err := ParseResize(payload(t, `{"execution_id":"e","rows":70000,"cols":80}`))
			return err
		},
		func() error {
			_, err := ParseSubmit(payload(t, `{"execution_id":"e","command":"sh","tty":{"rows":24,"cols":80}}`))
			return err
		},
		func() error {
			_, err := ParseSubmit(payload(t, `{"execution_id":"e","command":"sh","process":true,"stdin":"aGk="}`))
			return err
		},
	} {
		if err := bad(); !errors.Is(err, ErrInvalid) {
			t.Errorf("accepted or not ErrInvalid: %v", err)
		}
	}
	if name, ok := SignalName(syscall.SIGTERM); !ok || name != "TERM" {
		t.Errorf("SignalName(TERM) = %q %v", name, ok)
	}
}

func FuzzParseDial(f *testing.F) {
	for _, s := range [][2]string{{"exec-1", "8000"}, {"", "80"}, {"e", "0"}, {"e", "08000"}, {"../x", "1"}, {"e", "65536"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, execution, port string) {
		id, n, err := ParseDial(execution, port)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if !ValidID(id) || n < 1 || n > 65535 {
			t.Fatalf("accepted %q %q", execution, port)
		}
	})
}
