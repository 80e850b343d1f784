package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		if !bytes.HasSuffix(l, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyDetectsTampering(t *testing.T) {
	cases := []struct {
		name    string
		tamper  func([][]byte) [][]byte
		raw     func([]byte) []byte // applied to the file bytes instead
		kind    error
		badSeq  uint64
		message string
	}{
		{name: "modified", kind: ErrTampered, badSeq: 4, message: "modified", tamper: func(l [][]byte) [][]byte {
			l[3] = bytes.Replace(l[3], []byte("go test"), []byte("go tost"), 1)
			return l
		}},
		{name: "deleted", kind: ErrTampered, badSeq: 5, message: "missing", tamper: func(l [][]byte) [][]byte {
			return append(l[:4:4], l[5:]...)
		}},
		{name: "inserted", kind: ErrTampered, badSeq: 3, message: "out of order", tamper: func(l [][]byte) [][]byte {
			out := append([][]byte{}, l[:2]...)
			out = append(out, l[0])
			return append(out, l[2:]...)
		}},
		{name: "reordered", kind: ErrTampered, badSeq: 6, message: "missing", tamper: func(l [][]byte) [][]byte {
			l[5], l[6] = l[6], l[5]
			return l
		}},
		{name: "rechained forgery", kind: ErrTampered, badSeq: 3, message: "prev_hash", tamper: func(l [][]byte) [][]byte {
			// A forged line with the right seq and a self-consistent
			// hash, but chained to nothing in this log.
			l[2] = forge(t, 3, GenesisHash)
			return l
		}},
		{name: "truncated line", kind: ErrMalformed, badSeq: 8, message: "", tamper: func(l [][]byte) [][]byte {
			l[7] = l[7][:len(l[7])/2]
			return l
		}},
		{name: "torn tail", kind: ErrTornTail, badSeq: 10, raw: func(b []byte) []byte { return b[:len(b)-20] }},
		{name: "not json", kind: ErrMalformed, badSeq: 2, tamper: func(l [][]byte) [][]byte {
			l[1] = []byte("this is not json")
			return l
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			writeEvents(t, path, 10)
			if c.raw != nil {
				data, _ := os.ReadFile(path)
				os.WriteFile(path, c.raw(data), 0o600)
			} else {
				writeLines(t, path, c.tamper(readLines(t, path)))
			}
			rep, err := Verify(t.Context(), path)
			if !errors.Is(err, c.kind) {
				t.Fatalf("err = %v, want %v", err, c.kind)
			}
			var ve *VerifyError
			if !errors.As(err, &ve) || ve.Seq != c.badSeq || rep.BadSeq != c.badSeq {
				t.Fatalf("err %v / report %+v: want bad seq %d", err, rep, c.badSeq)
			}
			if !strings.Contains(err.Error(), c.message) {
				t.Fatalf("error %q does not say %q", err, c.message)
			}
		})
	}
}

// forge builds a line that is internally consistent for seq and prev.
func forge(t *testing.T, seq uint64, prev string) []byte {
	t.Helper()
	e := Event{Action: "shell", Target: "forged", Seq: seq, PrevHash: prev}
	c, err := e.canonical()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(string(c[:len(c)-1]) + hashKey + chainHash(prev, c) + "\"}\n")
}

func TestVerifyNotALog(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"empty-object": "{}\n",
		"text":         "hello world\n",
		"binary":       "\x00\x01\x02\xff\n",
		"array":        "[1,2,3]\n",
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		_, err := Verify(t.Context(), p)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), ":1:") {
			t.Errorf("%s: err = %v, want ErrMalformed naming line 1", name, err)
		}
	}
	if _, err := Verify(t.Context(), filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestRotationKeepsOneChain(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	writeEvents(t, path, 50, WithMaxSize(2000))
	writeEvents(t, path, 50, WithMaxSize(2000)) // a second process-lifetime continues it
	rotated, err := rotatedFiles(path)
	if err != nil || len(rotated) < 3 {
		t.Fatalf("rotated files %v, %v", rotated, err)
	}
	for _, f := range append(rotated, path) {
		if st, err := os.Stat(f); err != nil || st.Size() > 2000 {
			t.Fatalf("%s: %v size %d", f, err, st.Size())
		}
	}
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.Events != 100 || rep.LastSeq != 100 {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	// Deleting a middle rotated file breaks the chain at its first seq.
	os.Remove(rotated[1])
	if _, err := Verify(t.Context(), path); !errors.Is(err, ErrTampered) {
		t.Fatalf("removed rotated file not detected: %v", err)
	}
}

func TestTornTailIsRepairedByNextAppend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 5)
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"time":"2026-01-01T00:00:00Z","seq":6,"act`)
	f.Close()
	if _, err := Verify(t.Context(), path); !errors.Is(err, ErrTornTail) {
		t.Fatalf("torn tail: %v", err)
	}
	writeEvents(t, path, 1)
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.LastSeq != 6 {
		t.Fatalf("after repair: %+v %v", rep, err)
	}
}

func TestConcurrentLoggersInOneProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		// Half the loggers wait for the lock in the kernel, half poll
		// (a context that can end): both ways must keep one chain.
		ctx := context.Background()
		if g%2 == 1 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
		}
		go func() {
			defer wg.Done()
			l, err := Open(t.Context(), path, WithDurability(NoSync), WithMaxSize(8<<10))
			if err != nil {
				t.Error(err)
				return
			}
			defer l.Close()
			for i := 0; i < 200; i++ {
				if err := l.Record(ctx, Event{Action: "a", Target: strconv.Itoa(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.LastSeq != 800 {
		t.Fatalf("report %+v err %v", rep, err)
	}
}

const helperEnv = "PULSE_AUDIT_HELPER_PATH"

// TestHelperAppend is the child process of TestTwoProcessesAppend.
func TestHelperAppend(t *testing.T) {
	path := os.Getenv(helperEnv)
	if path == "" {
		t.Skip("helper process only: run by TestTwoProcessesAppend")
	}
	n, _ := strconv.Atoi(os.Getenv("PULSE_AUDIT_HELPER_N"))
	l, err := Open(t.Context(), path, WithDurability(NoSync), WithMaxSize(256<<10), WithSessionID(os.Getenv("PULSE_AUDIT_HELPER_ID")))
	if err != nil {
		t.Fatal(err)
	}
	// Start together, so that the appends really interleave.
	for _, err := os.Stat(path + ".go"); err != nil; _, err = os.Stat(path + ".go") {
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < n; i++ {
		if i == n/2 {
			meetHalfWay(t, path, os.Getenv("PULSE_AUDIT_HELPER_ID"))
		}
		if err := l.Record(context.Background(), Event{Action: "shell", Target: fmt.Sprint("cmd ", i), Decision: "allow"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTwoProcessesAppend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const perProc = 5000
	var cmds []*exec.Cmd
	for _, id := range []string{"agent", "review"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAppend$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"="+path, "PULSE_AUDIT_HELPER_N="+strconv.Itoa(perProc), "PULSE_AUDIT_HELPER_ID="+id)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s output:\n%s", id, out.String())
			}
		})
	}
	if err := os.WriteFile(path+".go", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("helper: %v", err)
		}
	}
	rep, err := Verify(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Events != 2*perProc || rep.LastSeq != 2*perProc {
		t.Fatalf("report %+v", rep)
	}
	// Both processes really interleaved into one chain.
	sessions := map[string]int{}
	switches, last := 0, ""
	for _, f := range rep.Files {
		data, _ := os.ReadFile(f)
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			e, err := ParseLine(line)
			if err != nil {
				t.Fatal(err)
			}
			sessions[e.SessionID]++
			if e.SessionID != last {
				switches++
				last = e.SessionID
			}
		}
	}
	if sessions["agent"] != perProc || sessions["review"] != perProc {
		t.Fatalf("events per process: %v", sessions)
	}
	if switches < 3 {
		t.Fatalf("the two processes did not interleave (%d runs)", switches)
	}
	t.Logf("%d runs of one process's events in one chain of %d", switches, rep.Events)
}

func TestVerifyAnchorCatchesTailTruncation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 6)
	rep, err := Verify(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	anchor := ExpectAnchor(rep.LastSeq, rep.LastHash)
	if _, err := Verify(t.Context(), path, anchor); err != nil {
		t.Fatalf("intact log fails its own anchor: %v", err)
	}
	writeEvents(t, path, 2) // growing past the anchor is fine
	if _, err := Verify(t.Context(), path, anchor); err != nil {
		t.Fatalf("grown log fails the anchor: %v", err)
	}
	// Cut the last four lines: the head record shows it...
	lines := readLines(t, path)
	writeLines(t, path, lines[:4])
	if rep, err := Verify(t.Context(), path); !errors.Is(err, ErrTruncated) || rep.BadSeq != 5 {
		t.Fatalf("truncated chain: %+v %v", rep, err)
	}
	// ...and so does the anchor, with the head removed as well.
	os.Remove(path + HeadSuffix)
	if _, err := Verify(t.Context(), path); err != nil {
		t.Fatalf("cut chain without its head: %v", err)
	}
	rep, err = Verify(t.Context(), path, anchor)
	if !errors.Is(err, ErrTampered) || rep.BadSeq != 5 || !strings.Contains(err.Error(), "removed from the end") {
		t.Fatalf("err %v, report %+v", err, rep)
	}
	// A rewritten log with a fresh chain of the same length fails too.
	os.Remove(path)
	writeEvents(t, path, 6)
	if _, err := Verify(t.Context(), path, anchor); !errors.Is(err, ErrTampered) || !strings.Contains(err.Error(), "rewritten") {
		t.Fatalf("rewritten log: %v", err)
	}
}

// TestVerifyDetectsRandomMutations applies random edits to a valid log:
// any changed byte, any line removed (except from the end, which needs an
// anchor), swapped or duplicated must fail verification, at or before the
// first line touched.
func TestVerifyDetectsRandomMutations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 20)
	orig := readLines(t, path)
	r := rand.New(rand.NewSource(11))
	for iter := 0; iter < 400; iter++ {
		lines := make([][]byte, len(orig))
		for i := range orig {
			lines[i] = append([]byte(nil), orig[i]...)
		}
		var first int // 0-based index of the first line touched
		switch op := r.Intn(4); op {
		case 0: // change one byte (never the newline, which would split lines)
			first = r.Intn(len(lines))
			l := lines[first]
			k := r.Intn(len(l) - 1)
			l[k] ^= byte(1 + r.Intn(255))
			if l[k] == '\n' {
				l[k] = 'x'
			}
		case 1: // remove a line that is not the last
			first = r.Intn(len(lines) - 1)
			lines = append(lines[:first], lines[first+1:]...)
		case 2: // swap two lines
			i, j := r.Intn(len(lines)), r.Intn(len(lines))
			if i == j {
				continue
			}
			lines[i], lines[j] = lines[j], lines[i]
			first = min(i, j)
		case 3: // duplicate a line somewhere
			i, j := r.Intn(len(lines)), r.Intn(len(lines)+1)
			dup := append([]byte(nil), lines[i]...)
			lines = append(lines[:j], append([][]byte{dup}, lines[j:]...)...)
			first = j
			if i == j || i == j-1 {
				// Next to its original, the copy reads as the original
				// and the line after it is the one out of place.
				first = j + 1
			}
		}
		writeLines(t, path, lines)
		rep, err := Verify(t.Context(), path)
		if err == nil {
			t.Fatalf("iteration %d: mutation of line %d not detected", iter, first+1)
		}
		if rep.BadSeq == 0 || rep.BadSeq > uint64(first+1) {
			t.Fatalf("iteration %d: first touched line %d, bad seq reported %d (%v)", iter, first+1, rep.BadSeq, err)
		}
	}
}
