package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/internal/testenv"
)

const auditRotHelperEnv = "PULSE_CLI_AUDIT_ROTHELPER_PATH"

// TestHelperAuditAppendRotating is the child of
// TestAuditExportDuringRotationByAnotherProcess: it appends small events
// as fast as it can to a log rotated every 8 KiB, until PATH.stop appears.
func TestHelperAuditAppendRotating(t *testing.T) {
	path := os.Getenv(auditRotHelperEnv)
	if path == "" {
		t.Skip("helper process only: run by TestAuditExportDuringRotationByAnotherProcess")
	}
	l, err := audit.Open(t.Context(), path, audit.WithDurability(audit.NoSync), audit.WithMaxSize(8<<10))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if i%64 == 0 {
			if _, err := os.Stat(path + ".stop"); err == nil {
				break
			}
		}
		if err := l.Record(context.Background(), audit.Event{Action: "shell", Target: strconv.Itoa(i), Decision: "allow"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// `pulse audit export` run while another process appends to the log and
// rotates it must export every event from seq 1 on, each once and in
// order, without a warning: nobody tampered with the log. The export
// listed the log's files without the append lock and opened the live
// file by name when it came to it, so rotations in between left the
// newly rotated segments out (their events were missing from the
// export: seq jumped), or the export failed with "no such file" when
// it opened the live file between its rename and its re-creation.
func TestAuditExportDuringRotationByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 1)
	stop := startAuditRotator(t, path)
	deadline := time.Now().Add(2 * time.Second)
	rounds, fails := 0, 0
	var last uint64
	for rounds < 40 && time.Now().Before(deadline) {
		rounds++
		code, stdout, stderr := runCLI(t, "audit", "export", "--format", "ecs", path)
		var seq uint64
		bad := ""
		for _, l := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
			var doc struct {
				Event struct {
					Sequence uint64 `json:"sequence"`
				} `json:"event"`
			}
			if err := json.Unmarshal([]byte(l), &doc); err != nil {
				bad = "unreadable line: " + err.Error()
				break
			}
			if doc.Event.Sequence != seq+1 {
				bad = "seq " + strconv.FormatUint(doc.Event.Sequence, 10) + " after seq " + strconv.FormatUint(seq, 10)
				break
			}
			seq = doc.Event.Sequence
		}
		if code != exitOK || bad != "" || stderr != "" {
			fails++
			if fails <= 3 {
				t.Errorf("round %d: export of a log nobody tampered with: exit %d, %s, stderr %q", rounds, code, bad, stderr)
			}
			continue
		}
		if seq < last {
			t.Errorf("round %d: the export went back from seq %d to %d", rounds, last, seq)
		}
		last = seq
	}
	stop()
	if fails > 0 {
		t.Errorf("%d of %d rounds of export failed", fails, rounds)
	}
	t.Logf("%d rounds of export, last seq %d", rounds, last)
}

// startAuditRotator starts TestHelperAuditAppendRotating on the log at
// path and waits for its first rotation; the function it returns stops
// the writer and waits for it.
func startAuditRotator(t *testing.T, path string) (stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAuditAppendRotating$", "-test.count=1")
	cmd.Env = append(os.Environ(), auditRotHelperEnv+"="+path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		os.WriteFile(path+".stop", nil, 0o600)
		if err := cmd.Wait(); err != nil {
			t.Errorf("writer: %v\n%s", err, out.String())
		}
	}
	t.Cleanup(stop)
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if files, _ := audit.Files(path); len(files) > 1 {
			return stop
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("the writer did not rotate the log")
		}
	}
}

// `pulse audit tail -f` following a log that another process appends to
// and rotates many times between two polls must print every event once,
// in order. On a rotation it listed the log's files without the append
// lock and then opened the live file by name, so a rotation in between
// made it skip the segment rotated last, whose events it never printed.
func TestAuditTailFollowsRotationByAnotherProcess(t *testing.T) {
	old := tailPoll
	tailPoll = time.Millisecond
	t.Cleanup(func() { tailPoll = old })

	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb testenv.SyncBuffer
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	done := make(chan int, 1)
	go func() { done <- run(ctx, env, []string{"audit", "tail", "-f", "-n", "-1", path}) }()
	stop := startAuditRotator(t, path)
	time.Sleep(1500 * time.Millisecond)
	stop()
	rep, err := audit.Verify(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	want := " #" + strconv.FormatUint(rep.LastSeq, 10) + " "
	for start := time.Now(); !strings.Contains(out.String(), want); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 20*time.Second {
			break
		}
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
	var seq uint64
	gaps := 0
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.HasPrefix(f[1], "#") {
			continue
		}
		n, err := strconv.ParseUint(f[1][1:], 10, 64)
		if err != nil {
			continue
		}
		if n != seq+1 {
			gaps++
			if gaps <= 3 {
				t.Errorf("tail -f printed seq %d after seq %d", n, seq)
			}
		}
		seq = n
	}
	if seq != rep.LastSeq || gaps > 0 {
		t.Fatalf("tail -f printed up to seq %d of %d, with %d gaps; stderr %s", seq, rep.LastSeq, gaps, errb.String())
	}
	t.Logf("tail -f printed seq 1..%d across %d files", seq, len(rep.Files))
}
