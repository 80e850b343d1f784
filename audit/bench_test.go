package audit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/secrets"
)

func benchEvent() Event {
	return Event{Action: "shell", Target: "go test ./... -run TestExec", Decision: "allow",
		IsolationLevel: "namespace", ExitCode: Int(0), DurationMS: 1234.5, Backend: "namespace",
		Detail: "Executed command via namespace backend"}
}

// plainAppend is the reference: the same events as JSON lines through an
// encoding/json Encoder on an O_APPEND file, with the same fsync policy but
// no lock, chain or scrubbing. It returns the time per event.
func plainAppend(b *testing.B, dir string, d Durability, n int) time.Duration {
	f, err := os.OpenFile(filepath.Join(dir, "plain.jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	e := benchEvent()
	start := time.Now()
	lastSync := start
	for i := 0; i < n; i++ {
		e.Time = time.Now()
		e.Seq = uint64(i)
		if err := enc.Encode(&e); err != nil {
			b.Fatal(err)
		}
		switch d.mode {
		case modeEvent:
			f.Sync()
		case modeInterval:
			if time.Since(lastSync) >= d.interval {
				f.Sync()
				lastSync = time.Now()
			}
		}
	}
	return time.Since(start) / time.Duration(n)
}

func BenchmarkRecord(b *testing.B) {
	sc := secrets.NewScrubber([]string{"not-in-these-events-1", "not-in-these-events-2"})
	for _, c := range []struct {
		name string
		d    Durability
		ref  int
	}{
		{"none", NoSync, 20000},
		{"every-100ms", SyncEvery(100 * time.Millisecond), 20000},
		{"each-event", SyncEachEvent, 200},
	} {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			ref := plainAppend(b, dir, c.d, c.ref)
			l, err := Open(filepath.Join(dir, "audit.jsonl"), WithDurability(c.d), WithScrubber(sc))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			e := benchEvent()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := l.Record(ctx, e); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(time.Second)/float64(per), "events/s")
			b.ReportMetric(float64(ref)/float64(per), "x-vs-json-append")
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.jsonl")
	l, err := Open(path, WithDurability(NoSync))
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		l.Record(context.Background(), benchEvent())
	}
	l.Close()
	st, _ := os.Stat(path)
	b.SetBytes(st.Size())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Verify(path); err != nil {
			b.Fatal(err)
		}
	}
}
