package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// table is lifecycle.py's VALID_TRANSITIONS, written out again here so
// that a change to the package's table shows up as a failure.
var table = map[State]map[State]bool{
	Created:          {Starting: true, Failed: true, Cleaning: true},
	Starting:         {Running: true, Failed: true, Cleaning: true},
	Running:          {Completing: true, Stopping: true, Failed: true},
	Stopping:         {Failed: true, Cleaning: true},
	Completing:       {Cleaning: true, Failed: true},
	Failed:           {Cleaning: true},
	Cleaning:         {Finalized: true, RecoveryRequired: true},
	Finalized:        {},
	RecoveryRequired: {},
}

// pathTo returns a sequence of valid transitions from Created to s.
func pathTo(s State) []State {
	paths := map[State][]State{
		Created:          nil,
		Starting:         {Starting},
		Running:          {Starting, Running},
		Stopping:         {Starting, Running, Stopping},
		Completing:       {Starting, Running, Completing},
		Failed:           {Failed},
		Cleaning:         {Cleaning},
		Finalized:        {Cleaning, Finalized},
		RecoveryRequired: {Cleaning, RecoveryRequired},
	}
	return paths[s]
}

// fakeClock ticks one second per reading, so history times are distinct
// and predictable without sleeping.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func newAt(t *testing.T, s State, opts ...Option) *Execution {
	t.Helper()
	e, err := New("exec-1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range pathTo(s) {
		if err := e.Transition(context.Background(), step); err != nil {
			t.Fatalf("reaching %s: %v", s, err)
		}
	}
	if e.State() != s {
		t.Fatalf("reached %s, want %s", e.State(), s)
	}
	return e
}

func TestStates(t *testing.T) {
	if got := len(States()); got != 9 {
		t.Fatalf("%d states, want 9", got)
	}
	for _, s := range States() {
		if _, ok := table[s]; !ok {
			t.Errorf("state %s not in the table", s)
		}
		if p, err := ParseState(s.String()); err != nil || p != s {
			t.Errorf("ParseState(%s) = %s, %v", s, p, err)
		}
		if s.Terminal() != (len(table[s]) == 0) {
			t.Errorf("%s.Terminal() = %v", s, s.Terminal())
		}
	}
	if _, err := ParseState("running"); err == nil {
		t.Error("ParseState accepted lower case")
	}
}

// TestEveryPair checks all 81 pairs against the table: allowed moves take
// effect, are recorded and reach the hook; refused ones change nothing.
func TestEveryPair(t *testing.T) {
	for _, from := range States() {
		for _, to := range States() {
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				var got []Transition
				clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
				e := newAt(t, from, WithClock(clock.now), WithHook(func(_ context.Context, tr Transition) {
					got = append(got, tr)
				}))
				before := e.History()
				hooks := len(got)
				err := e.Transition(context.Background(), to)

				if CanTransition(from, to) != table[from][to] {
					t.Fatalf("CanTransition = %v, table says %v", CanTransition(from, to), table[from][to])
				}
				switch {
				case table[from][to]:
					if err != nil {
						t.Fatalf("allowed move refused: %v", err)
					}
					if e.State() != to {
						t.Fatalf("state = %s", e.State())
					}
					h := e.History()
					if len(h) != len(before)+1 || h[len(h)-1].State != to || !h[len(h)-1].At.After(before[len(before)-1].At) {
						t.Fatalf("history = %v", h)
					}
					if len(got) != hooks+1 || got[len(got)-1] != (Transition{ExecutionID: "exec-1", From: from, To: to, At: h[len(h)-1].At}) {
						t.Fatalf("hook saw %v", got)
					}
				case to == Failed && from.Terminal():
					if err != nil {
						t.Fatalf("Failed from terminal %s: %v, want a no-op", from, err)
					}
					if e.State() != from || len(e.History()) != len(before) || len(got) != hooks {
						t.Fatal("Failed from a terminal state changed something")
					}
				default:
					var te *TransitionError
					if !errors.Is(err, ErrInvalidTransition) || !errors.As(err, &te) || te.From != from || te.To != to {
						t.Fatalf("err = %v, want a TransitionError %s->%s", err, from, to)
					}
					if !strings.Contains(err.Error(), string(from)) || !strings.Contains(err.Error(), string(to)) {
						t.Errorf("error does not name both states: %v", err)
					}
					if e.State() != from || len(e.History()) != len(before) || len(got) != hooks {
						t.Fatal("refused move changed something")
					}
				}
			})
		}
	}
}

func TestNew(t *testing.T) {
	if _, err := New(""); err == nil {
		t.Error("empty id accepted")
	}
	if _, err := New("x", WithHook(nil)); err == nil {
		t.Error("nil hook accepted")
	}
	if _, err := New("x", WithClock(nil)); err == nil {
		t.Error("nil clock accepted")
	}
	at := time.Unix(1_700_000_000, 0)
	e, err := New("x", WithClock(func() time.Time { return at }))
	if err != nil {
		t.Fatal(err)
	}
	if e.ID() != "x" || e.State() != Created || !e.CreatedAt().Equal(at) {
		t.Errorf("new execution = %s %s %v", e.ID(), e.State(), e.CreatedAt())
	}
	if h := e.History(); len(h) != 1 || h[0] != (Entry{At: at, State: Created}) {
		t.Errorf("history = %v", h)
	}
}

func TestHookGetsContextAndMayRead(t *testing.T) {
	type key struct{}
	var e *Execution
	var seen []State
	var err error
	e, err = New("x", WithHook(func(ctx context.Context, tr Transition) {
		if ctx.Value(key{}) != "v" {
			t.Error("hook did not get the caller's context")
		}
		seen = append(seen, e.State()) // must not deadlock
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(context.Background(), key{}, "v")
	for _, s := range []State{Starting, Running, Completing, Cleaning, Finalized} {
		if err := e.Transition(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if want := []State{Starting, Running, Completing, Cleaning, Finalized}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("hook saw %v, want %v", seen, want)
	}
}

// TestConcurrent races transitions from many goroutines: exactly one of
// each competing move wins, and the hook sees the moves in history order.
func TestConcurrent(t *testing.T) {
	var mu sync.Mutex
	var hooked []State
	e, err := New("x", WithHook(func(_ context.Context, tr Transition) {
		mu.Lock()
		hooked = append(hooked, tr.To)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	steps := []State{Starting, Running, Stopping, Failed, Cleaning, RecoveryRequired}
	next := map[State]State{Created: Starting}
	for i := 1; i < len(steps); i++ {
		next[steps[i-1]] = steps[i]
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				cur := e.State()
				if cur.Terminal() {
					return
				}
				// Losers of a race get an error and read the state again.
				_ = e.Transition(context.Background(), next[cur])
				_ = e.History()
				_, _ = json.Marshal(e)
			}
		}()
	}
	wg.Wait()
	if e.State() != RecoveryRequired {
		t.Fatalf("final state %s", e.State())
	}
	h := e.History()
	if len(h) != len(steps)+1 {
		t.Fatalf("history has %d entries, want %d: %v", len(h), len(steps)+1, h)
	}
	for i, s := range steps {
		if h[i+1].State != s {
			t.Errorf("history[%d] = %s, want %s", i+1, h[i+1].State, s)
		}
	}
	if fmt.Sprint(hooked) != fmt.Sprint(steps) {
		t.Errorf("hook order %v, want %v", hooked, steps)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 250_000_000)}
	e := newAt(t, Finalized, WithClock(clock.now))
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if raw["execution_id"] != "exec-1" || raw["state"] != "FINALIZED" || raw["created_at"] != 1_700_000_001.25 {
		t.Errorf("wire form = %s", data)
	}
	hist, _ := raw["history"].([]any)
	if len(hist) != 3 || fmt.Sprint(hist[0]) != "[1.70000000125e+09 CREATED]" {
		t.Errorf("history wire form = %v", raw["history"])
	}
	back, err := Restore(data)
	if err != nil {
		t.Fatal(err)
	}
	if back.ID() != e.ID() || back.State() != e.State() {
		t.Errorf("restored %s %s", back.ID(), back.State())
	}
	h1, h2 := e.History(), back.History()
	for i := range h1 {
		if h1[i].State != h2[i].State || h1[i].At.Sub(h2[i].At).Abs() > time.Microsecond {
			t.Errorf("history[%d]: %v vs %v", i, h1[i], h2[i])
		}
	}
	// The Python implementation's output decodes too.
	py := `{"execution_id": "e", "state": "RUNNING", "created_at": 1700000000.5,
		"history": [[1700000000.5, "CREATED"], [1700000001.0, "STARTING"], [1700000002.25, "RUNNING"]]}`
	var fromPy Execution
	if err := json.Unmarshal([]byte(py), &fromPy); err != nil {
		t.Fatal(err)
	}
	if fromPy.State() != Running || len(fromPy.History()) != 3 {
		t.Errorf("decoded %s %v", fromPy.State(), fromPy.History())
	}
	if err := fromPy.Transition(context.Background(), Completing); err != nil {
		t.Errorf("decoded execution cannot move on: %v", err)
	}
}

func TestUnmarshalRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"not json":        `{`,
		"no id":           `{"state":"CREATED","history":[[1,"CREATED"]]}`,
		"empty history":   `{"execution_id":"e","state":"CREATED","history":[]}`,
		"bad start":       `{"execution_id":"e","state":"RUNNING","history":[[1,"RUNNING"]]}`,
		"skipped step":    `{"execution_id":"e","state":"RUNNING","history":[[1,"CREATED"],[2,"RUNNING"]]}`,
		"state mismatch":  `{"execution_id":"e","state":"FINALIZED","history":[[1,"CREATED"],[2,"STARTING"]]}`,
		"unknown state":   `{"execution_id":"e","state":"CREATED","history":[[1,"CREATED"],[2,"PAUSED"]]}`,
		"bad pair":        `{"execution_id":"e","state":"CREATED","history":[[1]]}`,
		"bad time":        `{"execution_id":"e","state":"CREATED","history":[["x","CREATED"]]}`,
		"time overflow":   `{"execution_id":"e","state":"CREATED","history":[[1e300,"CREATED"]]}`,
		"lower case":      `{"execution_id":"e","state":"created","history":[[1,"created"]]}`,
		"history object":  `{"execution_id":"e","state":"CREATED","history":{}}`,
		"pair not a list": `{"execution_id":"e","state":"CREATED","history":[{"a":1}]}`,
	} {
		e := newAt(t, Starting)
		err := e.UnmarshalJSON([]byte(in))
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
		if e.State() != Starting || e.ID() != "exec-1" || len(e.History()) != 2 {
			t.Errorf("%s: a refused decode changed the execution", name)
		}
	}
}

func FuzzRestore(f *testing.F) {
	f.Add([]byte(`{"execution_id":"e","state":"RUNNING","created_at":1,"history":[[1,"CREATED"],[2,"STARTING"],[3,"RUNNING"]]}`))
	f.Add([]byte(`{"execution_id":"e","state":"CREATED","history":[[1,"CREATED"]]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Restore(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever is accepted is a reachable execution that round-trips.
		h := e.History()
		if len(h) == 0 || h[0].State != Created || h[len(h)-1].State != e.State() {
			t.Fatalf("accepted an impossible history: %v", h)
		}
		for i := 1; i < len(h); i++ {
			if !CanTransition(h[i-1].State, h[i].State) {
				t.Fatalf("accepted %s -> %s", h[i-1].State, h[i].State)
			}
		}
		out, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Restore(out)
		if err != nil || back.State() != e.State() || len(back.History()) != len(h) {
			t.Fatalf("round trip failed: %v", err)
		}
	})
}
