package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/secrets"
)

func writeEvents(t *testing.T, path string, n int, opts ...Option) {
	t.Helper()
	l, err := Open(t.Context(), path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if err := l.Record(context.Background(), Event{Action: "shell", Target: "go test ./...", Decision: "allow", ExitCode: Int(i % 2)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRecordAndVerify(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	sc := secrets.NewScrubber([]string{"s3cr3t-token"})
	l, err := Open(t.Context(), path, WithScrubber(sc), WithSessionID("sess-1"), WithDurability(SyncEachEvent))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Record(ctx, Event{Action: "shell", Target: "curl -H 'Authorization: s3cr3t-token'", Decision: "allow", ExitCode: Int(0)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, Event{Action: "network", Destination: "*", Protocol: "any", Decision: "deny", EnforcementLevel: "strong", Backend: "namespace"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, Event{Action: "x"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Record after Close: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "s3cr3t-token") || !strings.Contains(string(data), "[REDACTED]") {
		t.Fatalf("secret not scrubbed:\n%s", data)
	}
	if !strings.Contains(string(data), `"exit_code":0`) || !strings.Contains(string(data), `"session_id":"sess-1"`) {
		t.Fatalf("missing fields:\n%s", data)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	rep, err := Verify(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Events != 2 || rep.FirstSeq != 1 || rep.LastSeq != 2 || rep.BadSeq != 0 {
		t.Fatalf("report %+v", rep)
	}
}

// TestHashRuleAsDocumented recomputes the chain the way SCHEMA.md tells a
// third party to, without the package's own helpers.
func TestHashRuleAsDocumented(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	writeEvents(t, path, 3)
	data, _ := os.ReadFile(path)
	prev := strings.Repeat("0", 64)
	for n, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		i := strings.LastIndex(line, `,"hash":"`)
		claimed := line[i+len(`,"hash":"`) : len(line)-2]
		sum := sha256.Sum256([]byte(prev + line[:i] + "}"))
		if hex.EncodeToString(sum[:]) != claimed {
			t.Fatalf("line %d: documented rule gives a different hash", n+1)
		}
		if !strings.Contains(line, `"prev_hash":"`+prev+`"`) {
			t.Fatalf("line %d: prev_hash is not the previous hash", n+1)
		}
		prev = claimed
	}
}

func TestOpenRefusesToChainOntoGarbage(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	os.WriteFile(path, []byte("this is not an audit log\n"), 0o600)
	if l, err := Open(t.Context(), path); !errors.Is(err, ErrMalformed) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Open on a non-log: %v, want ErrMalformed", err)
	}
	// The same when the garbage appears after Open.
	path2 := t.TempDir() + "/audit.jsonl"
	l, err := Open(t.Context(), path2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.WriteFile(path2, []byte("garbage\n"), 0o600)
	if err := l.Record(context.Background(), Event{Action: "x"}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Record onto a non-log: %v, want ErrMalformed", err)
	}
}

func TestChainContinuesAfterCrashBetweenRenameAndCreate(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	writeEvents(t, path, 4)
	// What a crash right after the rotation rename leaves: no live file.
	if err := os.Rename(path, rotatedName(path, 4)); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(t.Context(), path); err != nil || rep.LastSeq != 4 {
		t.Fatalf("rotated-only log: %+v %v", rep, err)
	}
	writeEvents(t, path, 2)
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.LastSeq != 6 || len(rep.Files) != 2 {
		t.Fatalf("report %+v err %v", rep, err)
	}
}

func TestSyncEveryFlushesInBackground(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	l, err := Open(t.Context(), path, WithDurability(SyncEvery(time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Record(context.Background(), Event{Action: "x"}); err != nil {
		t.Fatal(err)
	}
	// A failure's bound: an fsync on a disk busy with other work (image
	// builds, other test packages) can take seconds.
	testenv.Eventually(t, time.Minute, func() error {
		l.mu.Lock()
		dirty := l.dirty
		l.mu.Unlock()
		if dirty {
			return errors.New("background sync never ran")
		}
		return nil
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	if _, err := Open(t.Context(), t.TempDir()+"/a", WithMaxSize(-1)); err == nil {
		t.Fatal("negative max size accepted")
	}
	if _, err := Open(t.Context(), t.TempDir()+"/no/such/dir/a"); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l, _ := Open(t.Context(), t.TempDir()+"/a")
	defer l.Close()
	if err := l.Record(ctx, Event{Action: "x"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Record with a cancelled context: %v", err)
	}
}

func TestRecordRefusesOversizedEvent(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	l, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = l.Record(context.Background(), Event{Action: "shell", Detail: strings.Repeat("x", MaxLineLen)})
	if !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("err = %v, want ErrEventTooLarge", err)
	}
	if err := l.Record(context.Background(), Event{Action: "shell"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(t.Context(), path); err != nil || rep.LastSeq != 1 {
		t.Fatalf("after refusal: %+v %v", rep, err)
	}
}

func TestOpenRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := dir + "/victim"
	os.WriteFile(victim, []byte("keep me\n"), 0o600)
	if err := os.Symlink(victim, dir+"/audit.jsonl"); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(t.Context(), dir+"/audit.jsonl"); err == nil {
		l.Close()
		t.Fatal("Open followed a symlink")
	}
	if data, _ := os.ReadFile(victim); string(data) != "keep me\n" {
		t.Fatalf("symlink target changed: %q", data)
	}
}

// TestEveryStringFieldIsScrubbed fills every string field of Event, found
// by reflection so that a field added later is covered too, with a secret.
func TestEveryStringFieldIsScrubbed(t *testing.T) {
	const secret = "hunter2-very-secret"
	path := t.TempDir() + "/audit.jsonl"
	l, err := Open(t.Context(), path, WithScrubber(secrets.NewScrubber([]string{secret})))
	if err != nil {
		t.Fatal(err)
	}
	var e Event
	v := reflect.ValueOf(&e).Elem()
	n := 0
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.String {
			f.SetString("x " + secret + " y")
			n++
		}
	}
	if n < 15 {
		t.Fatalf("only %d string fields found", n)
	}
	if err := l.Record(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	l.Close()
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), secret) {
		t.Fatalf("secret written to the log:\n%s", data)
	}
	// Chain fields (key_id, prev_hash, hash) are the logger's own; the
	// rest must be redacted.
	if got := strings.Count(string(data), "[REDACTED]"); got != n-3 {
		t.Fatalf("%d fields redacted, want %d:\n%s", got, n-3, data)
	}
}

func TestRecordGivesUpOnLockWhenContextEnds(t *testing.T) {
	path := t.TempDir() + "/audit.jsonl"
	l, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Another open file description holding the lock stands in for a
	// stopped process that holds it.
	holder, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := flock.TryLock(holder); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Record(ctx, Event{Action: "x"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Record while locked: %v, want DeadlineExceeded", err)
	}
	flock.Unlock(holder)
	if err := l.Record(context.Background(), Event{Action: "x"}); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(t.Context(), path); err != nil || rep.LastSeq != 1 {
		t.Fatalf("%+v %v", rep, err)
	}
}
