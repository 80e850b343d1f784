package audit

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// fullEvent sets every field of Event, so that a field left out of the
// canonical encoding (or moved in it) changes the bytes below.
func fullEvent(t *testing.T) Event {
	t.Helper()
	e := Event{
		Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)), Seq: 7,
		SessionID: "s", ExecutionID: "x", Action: "a", Target: "t", Decision: "d", IsolationLevel: "i",
		Detail: "de", ExitCode: Int(0), DurationMS: 1.5, ContainerID: "c", Reason: "r",
		Destination: "dst", Port: 443, Protocol: "tcp", EnforcementLevel: "strong", Backend: "b",
		Actor: "ac", Via: "v", TxID: "tx", ContentSHA256: "sha", KeyID: "k", PrevHash: "p", Hash: "h",
	}
	v := reflect.ValueOf(e)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fullEvent leaves %s unset", v.Type().Field(i).Name)
		}
	}
	return e
}

// TestCanonicalBytes pins the bytes the hash chain covers: the order and
// names of the members, Time in UTC at fixed width, and no "hash" member.
// Logs already written verify only while this holds.
func TestCanonicalBytes(t *testing.T) {
	if _, ok := any(&Event{}).(json.Marshaler); ok {
		t.Fatal("*Event is a json.Marshaler: wireEvent, which embeds it, would encode through it")
	}
	e := fullEvent(t)
	got, err := e.canonical()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"time":"2026-01-02T02:04:05.000000006Z","seq":7,"session_id":"s","execution_id":"x",` +
		`"action":"a","target":"t","decision":"d","isolation_level":"i","detail":"de","exit_code":0,` +
		`"duration_ms":1.5,"container_id":"c","reason":"r","destination":"dst","port":443,"protocol":"tcp",` +
		`"enforcement_level":"strong","backend":"b","actor":"ac","via":"v","tx_id":"tx","sha256":"sha",` +
		`"key_id":"k","prev_hash":"p"}`
	if string(got) != want {
		t.Fatalf("canonical =\n%s\nwant\n%s", got, want)
	}
	min, err := (&Event{Action: "a"}).canonical()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"time":"0001-01-01T00:00:00.000000000Z","seq":0,"action":"a","prev_hash":""}`; string(min) != want {
		t.Fatalf("canonical of a bare event = %s, want %s", min, want)
	}
}

// TestParseLineRoundTrip: every field of an Event comes back from its line.
func TestParseLineRoundTrip(t *testing.T) {
	e := fullEvent(t)
	canon, err := e.canonical()
	if err != nil {
		t.Fatal(err)
	}
	line := append(canon[:len(canon)-1:len(canon)-1], `,"hash":"h"}`...)
	got, err := ParseLine(line)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Time.Equal(e.Time) {
		t.Fatalf("time %v, want %v", got.Time, e.Time)
	}
	got.Time = e.Time
	if !reflect.DeepEqual(got, e) {
		t.Fatalf("ParseLine =\n%+v\nwant\n%+v", got, e)
	}
}
