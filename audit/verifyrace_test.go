package audit

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

const rotHelperEnv = "PULSE_AUDIT_ROTHELPER_PATH"

// TestHelperAppendRotating is the child of
// TestVerifyDuringRotationByAnotherProcess: it appends small events as
// fast as it can to a log rotated every 16 KiB, until PATH.stop appears.
func TestHelperAppendRotating(t *testing.T) {
	path := os.Getenv(rotHelperEnv)
	if path == "" {
		t.Skip("helper process only: run by TestVerifyDuringRotationByAnotherProcess")
	}
	l, err := Open(t.Context(), path, WithDurability(NoSync), WithMaxSize(16<<10))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if i%64 == 0 {
			if _, err := os.Stat(path + ".stop"); err == nil {
				break
			}
		}
		if err := l.Record(context.Background(), Event{Action: "shell", Target: strconv.Itoa(i), Decision: "allow"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// Verify run while another process appends to the log and rotates it
// must find the log intact every time: nobody tampered with it. Verify
// read the head record under the append lock but listed the rotated
// files, and read the live file, without it, so a rotation in between
// left a newly rotated segment out of the chain ("events a..b are
// missing", ErrTampered) or ended the chain before the head record
// ("were cut from the end", ErrTruncated).
func TestVerifyDuringRotationByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// The log exists before the writer starts, so that Verify has
	// something to read from the first round on.
	writeEvents(t, path, 1)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAppendRotating$", "-test.count=1")
	cmd.Env = append(os.Environ(), rotHelperEnv+"="+path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		os.WriteFile(path+".stop", nil, 0o600)
		if err := cmd.Wait(); err != nil {
			t.Errorf("writer: %v\n%s", err, out.String())
		}
	}
	defer stop()

	// Wait for the writer to have rotated, then verify while it goes on.
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if files, _ := Files(path); len(files) > 1 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("the writer did not rotate the log")
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	rounds, fails := 0, 0
	var last uint64
	for rounds < 40 && time.Now().Before(deadline) {
		rep, err := Verify(t.Context(), path)
		rounds++
		if err != nil {
			fails++
			if fails <= 3 {
				t.Errorf("round %d: Verify of a log nobody tampered with: %v", rounds, err)
			}
			continue
		}
		if rep.LastSeq < last {
			t.Errorf("round %d: the log went back from seq %d to %d", rounds, last, rep.LastSeq)
		}
		last = rep.LastSeq
	}
	stop()
	if fails > 0 {
		t.Errorf("%d of %d rounds of Verify failed", fails, rounds)
	}
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.LastSeq < last {
		t.Fatalf("after the writer stopped: %+v %v", rep, err)
	}
	t.Logf("%d rounds of Verify, last seq %d, %d files at the end", rounds, last, len(rep.Files))
}
