package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzVerify feeds arbitrary files to Verify: it must not panic, must
// classify every failure as malformed, tampered or torn, and may call a
// file intact only if every line is a well-formed event with the right
// seq.
func FuzzVerify(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "audit.jsonl")
	l, err := Open(f.Context(), good, WithDurability(NoSync))
	if err != nil {
		f.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		l.Record(context.Background(), Event{Action: "shell", Target: "echo hi", ExitCode: Int(i)})
	}
	l.Close()
	data, _ := os.ReadFile(good)
	f.Add(data)
	f.Add(data[:len(data)-5])
	f.Add(bytes.Replace(data, []byte("echo"), []byte("ecko"), 1))
	f.Add([]byte("{}\n"))
	f.Add([]byte("not json\n"))
	f.Add([]byte(""))
	f.Add([]byte(`{"time":"x","seq":1,"prev_hash":"","hash":""}` + "\n"))
	f.Fuzz(func(t *testing.T, content []byte) {
		rep, err := VerifyReader(bytes.NewReader(content), "fuzz")
		if err != nil {
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("error is not a *VerifyError: %v", err)
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTampered) && !errors.Is(err, ErrTornTail) {
				t.Fatalf("unclassified error: %v", err)
			}
			if rep.BadSeq != uint64(rep.Events)+1 {
				t.Fatalf("bad seq %d after %d intact events", rep.BadSeq, rep.Events)
			}
			return
		}
		lines := bytes.Split(content, []byte("\n"))
		if len(lines[len(lines)-1]) != 0 {
			t.Fatalf("intact log does not end in a newline")
		}
		lines = lines[:len(lines)-1]
		if rep.Events != len(lines) {
			t.Fatalf("%d events reported for %d lines", rep.Events, len(lines))
		}
		for i, line := range lines {
			e, err := ParseLine(line)
			if err != nil || e.Seq != uint64(i+1) {
				t.Fatalf("line %d accepted but parses as %+v, %v", i+1, e, err)
			}
		}
	})
}
