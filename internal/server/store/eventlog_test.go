package store

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// Events survive a reopen, a record cut short by a crash ends the log
// without an error, and events an older version wrote into the database
// are returned with the logged ones, in seq order, once each.
func TestEventLogDurableTornTailAndLegacyRows(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db.sqlite3")
	s := open(t, path)
	if _, err := s.db.ExecContext(ctx, `INSERT INTO stream_events (execution_id, seq, stream, data) VALUES ('e', 1, 'stdout', ?)`, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEvents(ctx, []Event{
		{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("old")}, // already in the table
		{ExecutionID: "e", Seq: 2, Stream: "stderr", Data: []byte("two")},
		{ExecutionID: "f", Seq: 1, Stream: "stdout", Data: []byte("other")},
		{ExecutionID: "e", Seq: 3, Stream: "stdout", Data: nil},
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// A crash in the middle of a record: its tail is missing.
	logFile := filepath.Join(path+"-events", "e.log")
	rec, _ := encodeEvents(nil, []Event{{ExecutionID: "e", Seq: 4, Stream: "stdout", Data: []byte("cut short")}})
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(rec[:len(rec)-3])
	f.Close()

	s = open(t, path)
	got, err := s.Events(ctx, "e", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("old")},
		{ExecutionID: "e", Seq: 2, Stream: "stderr", Data: []byte("two")},
		{ExecutionID: "e", Seq: 3, Stream: "stdout", Data: []byte{}},
	}
	if len(got) != len(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || got[i].Stream != want[i].Stream || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("event %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if after, _ := s.Events(ctx, "e", 2); len(after) != 1 || after[0].Seq != 3 {
		t.Fatalf("after seq 2: %+v", after)
	}
	if other, _ := s.Events(ctx, "f", 0); len(other) != 1 || string(other[0].Data) != "other" {
		t.Fatalf("other execution: %+v", other)
	}

	// A malformed record (not a cut-short one) is an error, not silence.
	os.WriteFile(filepath.Join(path+"-events", "g.log"), []byte{1, 7, 0}, 0o600)
	if _, err := s.Events(ctx, "g", 0); err == nil {
		t.Fatal("a record with stream 7 was accepted")
	}
	// An id that cannot name a file is refused, not looked up.
	if err := s.AppendEvents(ctx, []Event{{ExecutionID: "../x", Seq: 1, Stream: "stdout"}}); err == nil {
		t.Fatal("an id with a path was accepted")
	}
}

// FuzzDecodeEvents: no input makes the reader panic or return an event
// that does not encode back to a prefix of the input.
func FuzzDecodeEvents(f *testing.F) {
	good, _ := encodeEvents(nil, []Event{{Seq: 1, Stream: "stdout", Data: []byte("a")}, {Seq: 2, Stream: "stderr", Data: []byte("bc")}})
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		evs, _ := decodeEvents(bufio.NewReader(bytes.NewReader(data)), "x", 0)
		re, err := encodeEvents(nil, evs)
		if err != nil {
			t.Fatalf("decoded events do not encode: %v", err)
		}
		if !bytes.HasPrefix(data, re) && len(evs) > 0 {
			// Varints have several encodings; compare meaning instead.
			again, _ := decodeEvents(bufio.NewReader(bytes.NewReader(re)), "x", 0)
			if len(again) != len(evs) {
				t.Fatalf("%d events decode, their encoding gives %d", len(evs), len(again))
			}
		}
	})
}
