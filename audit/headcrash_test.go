package audit

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const headCrashEnv = "PULSE_AUDIT_HEADCRASH_PATH"

// TestHelperKilledBeforeHead is the child of
// TestKeyedLogKilledBeforeItsFirstHeadVerifies: it appends one keyed event
// (to a new log, or to one PULSE_AUDIT_HEADCRASH_LEGACY says the parent
// started unkeyed without a head record) and SIGKILLs itself after the
// line is written, before the head record is updated.
func TestHelperKilledBeforeHead(t *testing.T) {
	path := os.Getenv(headCrashEnv)
	if path == "" {
		t.Skip("helper process")
	}
	l, err := Open(t.Context(), path, WithKey(testKey(t, 7)), WithDurability(SyncEachEvent))
	if err != nil {
		t.Fatal(err)
	}
	headHook = func() { syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	l.Record(t.Context(), Event{Action: "sandbox-init", Target: "namespace", Decision: "allow"})
	t.Fatal("not killed")
}

// A keyed writer killed between writing the lines of its first append and
// writing the head record left a keyed log beside an empty head record:
// Verify reported it as tampered ("the head record of a keyed log is
// missing"), and the next writer recorded an audit-head-mismatch event,
// so the log failed verification for good although nothing had been cut.
// The crash must leave the head behind the log, which is accepted, and
// the events of both writers must verify.
func TestKeyedLogKilledBeforeItsFirstHeadVerifies(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "new log"
		if legacy {
			name = "unkeyed log without a head record"
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			var before uint64
			if legacy {
				writeEvents(t, path, 3)
				if err := os.Remove(path + HeadSuffix); err != nil {
					t.Fatal(err)
				}
				before = 3
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKilledBeforeHead$", "-test.count=1")
			cmd.Env = append(os.Environ(), headCrashEnv+"="+path)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child was not killed: %v\n%s", err, out.String())
			}
			if evs := readEvents(t, path); uint64(len(evs)) != before+1 || evs[before].KeyID == "" {
				t.Fatalf("after the crash the log holds %d events, want %d ending in a keyed one", len(evs), before+1)
			}
			k := testKey(t, 7)
			if rep, err := Verify(t.Context(), path, VerifyKey(k)); err != nil || rep.LastSeq != before+1 {
				t.Fatalf("after the crash: %+v %v, want intact through seq %d", rep, err, before+1)
			}
			l, err := Open(t.Context(), path, WithKey(k))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Record(t.Context(), Event{Action: "shell", Target: "true"}); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(t.Context(), path, VerifyKey(k))
			if err != nil || rep.LastSeq != before+2 || !rep.Head || rep.HeadSeq != before+2 {
				t.Fatalf("after the next append: %+v %v", rep, err)
			}
			for _, e := range readEvents(t, path) {
				if e.Action == ActionHeadMismatch {
					t.Fatalf("the next writer took the crash for a cut: %s", e.Detail)
				}
			}
		})
	}
}

// The seq-0 head record a keyed writer leaves before its first line is
// accepted only as that: naming the genesis hash, under the key. An
// unkeyed one beside a keyed log (forged without the key) is tampering.
func TestSeqZeroHeadOfAKeyedLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	k := testKey(t, 7)
	l, err := Open(t.Context(), path, WithKey(k))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := l.Record(t.Context(), Event{Action: "shell"}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if err := os.WriteFile(path+HeadSuffix, encodeHead(k, 0, GenesisHash), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(t.Context(), path, VerifyKey(k)); err != nil {
		t.Fatalf("keyed seq-0 head: %v", err)
	}
	if err := os.WriteFile(path+HeadSuffix, encodeHead(nil, 0, GenesisHash), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(t.Context(), path, VerifyKey(k)); !errors.Is(err, ErrTampered) || !strings.Contains(err.Error(), "seq 0") {
		t.Fatalf("unkeyed seq-0 head beside a keyed log: %v, want ErrTampered", err)
	}
}
