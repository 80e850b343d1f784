package audit

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/secrets"
)

func writeEvents(t *testing.T, path string, n int, opts ...Option) {
	t.Helper()
	l, err := Open(path, opts...)
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
	l, err := Open(path, WithScrubber(sc), WithSessionID("sess-1"), WithDurability(SyncEachEvent))
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
	rep, err := Verify(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Events != 2 || rep.FirstSeq != 1 || rep.LastSeq != 2 || rep.BadSeq != 0 {
		t.Fatalf("report %+v", rep)
	}
}
