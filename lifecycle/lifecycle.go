package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// State is where an execution is in its life. The string forms are the
// ones the Python implementation and the audit log use.
type State string

// The nine states.
const (
	Created          State = "CREATED"
	Starting         State = "STARTING"
	Running          State = "RUNNING"
	Stopping         State = "STOPPING"
	Completing       State = "COMPLETING"
	Failed           State = "FAILED"
	Cleaning         State = "CLEANING"
	Finalized        State = "FINALIZED"
	RecoveryRequired State = "RECOVERY_REQUIRED"
)

// transitions is the table of lifecycle.py, unchanged.
var transitions = map[State][]State{
	Created:          {Starting, Failed, Cleaning},
	Starting:         {Running, Failed, Cleaning},
	Running:          {Completing, Stopping, Failed},
	Stopping:         {Failed, Cleaning},
	Completing:       {Cleaning, Failed},
	Failed:           {Cleaning},
	Cleaning:         {Finalized, RecoveryRequired},
	Finalized:        nil,
	RecoveryRequired: nil,
}

// States lists the nine states in the order of the table.
func States() []State {
	return []State{Created, Starting, Running, Stopping, Completing, Failed, Cleaning, Finalized, RecoveryRequired}
}

// String returns the state's name.
func (s State) String() string { return string(s) }

// Valid reports whether s is one of the nine states.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// Terminal reports whether no transition leaves s.
func (s State) Terminal() bool { return s == Finalized || s == RecoveryRequired }

// CanTransition reports whether the table allows from -> to.
func CanTransition(from, to State) bool {
	return slices.Contains(transitions[from], to)
}

// ParseState returns the state named s (exact, upper case).
func ParseState(s string) (State, error) {
	if st := State(s); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("lifecycle: unknown state %q", s)
}

// ErrInvalidTransition is wrapped by every refused transition.
var ErrInvalidTransition = errors.New("invalid lifecycle transition")

// TransitionError is a refused transition; it wraps ErrInvalidTransition.
type TransitionError struct {
	ExecutionID string
	From, To    State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("lifecycle: execution %q cannot go from %s to %s", e.ExecutionID, e.From, e.To)
}

func (e *TransitionError) Unwrap() error { return ErrInvalidTransition }

// Transition is one move of one execution, as given to a Hook.
type Transition struct {
	ExecutionID string
	From, To    State
	At          time.Time
}

// Hook is told of every transition, in order, after it took effect. It
// must not call Transition on the same Execution (that would deadlock);
// reading State or History is fine.
type Hook func(ctx context.Context, t Transition)

// Entry is one point of an execution's history.
type Entry struct {
	At    time.Time
	State State
}

type options struct {
	hook Hook
	now  func() time.Time
}

// Option configures an Execution.
type Option func(*options) error

// WithHook sets the function told of every transition.
func WithHook(h Hook) Option {
	return func(o *options) error {
		if h == nil {
			return errors.New("lifecycle: nil hook")
		}
		o.hook = h
		return nil
	}
}

// WithClock sets the clock that stamps the history; tests use it.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return errors.New("lifecycle: nil clock")
		}
		o.now = now
		return nil
	}
}

// Execution tracks the life of one sandbox execution. Its methods are
// safe for concurrent use.
type Execution struct {
	// hookMu is held across a whole transition, hook call included, so
	// that hooks see transitions in the order they happened; mu guards
	// the fields and is released before the hook runs so the hook may
	// read them.
	hookMu  sync.Mutex
	mu      sync.Mutex
	id      string
	state   State
	history []Entry
	opts    options
}

// New returns an execution in state Created, its history holding that one
// entry.
func New(id string, opts ...Option) (*Execution, error) {
	e := &Execution{}
	if err := e.configure(opts); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, errors.New("lifecycle: empty execution id")
	}
	e.id = id
	e.state = Created
	e.history = []Entry{{At: e.opts.now(), State: Created}}
	return e, nil
}

// Restore rebuilds an execution from its JSON form (see MarshalJSON),
// with opts applied as in New.
func Restore(data []byte, opts ...Option) (*Execution, error) {
	e := &Execution{}
	if err := e.configure(opts); err != nil {
		return nil, err
	}
	if err := e.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Execution) configure(opts []Option) error {
	e.opts.now = time.Now
	for _, opt := range opts {
		if err := opt(&e.opts); err != nil {
			return err
		}
	}
	return nil
}

// ID returns the execution id.
func (e *Execution) ID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.id
}

// State returns the current state.
func (e *Execution) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// CreatedAt returns when the execution was created (its first history entry).
func (e *Execution) CreatedAt() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.history) == 0 {
		return time.Time{}
	}
	return e.history[0].At
}

// History returns a copy of the history, oldest first.
func (e *Execution) History() []Entry {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.history)
}

// Transition moves the execution to state to, records it and calls the
// hook with ctx. A move the table does not allow returns a
// *TransitionError (wrapping ErrInvalidTransition) and changes nothing,
// except Failed from a terminal state, which is a no-op returning nil.
func (e *Execution) Transition(ctx context.Context, to State) error {
	e.hookMu.Lock()
	defer e.hookMu.Unlock()

	e.mu.Lock()
	from := e.state
	if !CanTransition(from, to) {
		e.mu.Unlock()
		if to == Failed && from.Terminal() {
			return nil
		}
		return &TransitionError{ExecutionID: e.id, From: from, To: to}
	}
	t := Transition{ExecutionID: e.id, From: from, To: to, At: e.now()}
	e.state = to
	e.history = append(e.history, Entry{At: t.At, State: to})
	hook := e.opts.hook
	e.mu.Unlock()

	if hook != nil {
		hook(ctx, t)
	}
	return nil
}

// now reads the clock; an Execution made by json.Unmarshal has none set.
func (e *Execution) now() time.Time {
	if e.opts.now == nil {
		return time.Now()
	}
	return e.opts.now()
}

// wire is the JSON form, the one lifecycle.py's serialize() returns.
type wire struct {
	ExecutionID string            `json:"execution_id"`
	State       State             `json:"state"`
	CreatedAt   float64           `json:"created_at"`
	History     []json.RawMessage `json:"history"`
}

func unixSeconds(t time.Time) float64 {
	// Adding the parts keeps the fraction as exact as float64 allows;
	// dividing UnixNano would not.
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}

func fromUnixSeconds(s float64) (time.Time, error) {
	// Beyond ±2^62 ns (about year 2116) UnixNano overflows; no real
	// execution lives there.
	if math.IsNaN(s) || math.IsInf(s, 0) || math.Abs(s) > float64(1<<62)/1e9 {
		return time.Time{}, fmt.Errorf("lifecycle: timestamp %v out of range", s)
	}
	sec, frac := math.Modf(s)
	return time.Unix(int64(sec), int64(math.Round(frac*1e9))), nil
}

// MarshalJSON writes the execution as lifecycle.py's serialize() does.
func (e *Execution) MarshalJSON() ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := wire{ExecutionID: e.id, State: e.state, History: make([]json.RawMessage, 0, len(e.history))}
	if len(e.history) > 0 {
		w.CreatedAt = unixSeconds(e.history[0].At)
	}
	for _, h := range e.history {
		raw, err := json.Marshal([]any{unixSeconds(h.At), h.State})
		if err != nil {
			return nil, err
		}
		w.History = append(w.History, raw)
	}
	return json.Marshal(w)
}

// ErrCorrupt is wrapped by UnmarshalJSON and Restore errors about data that
// does not describe a possible execution.
var ErrCorrupt = errors.New("lifecycle: corrupt execution record")

// UnmarshalJSON replaces the execution's id, state and history with the
// ones in data, after checking that the history starts in Created, follows
// the table step by step and ends in the recorded state. The hook and clock
// are kept. On error the execution is unchanged.
func (e *Execution) UnmarshalJSON(data []byte) error {
	var w wire
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if w.ExecutionID == "" {
		return fmt.Errorf("%w: empty execution_id", ErrCorrupt)
	}
	if len(w.History) == 0 {
		return fmt.Errorf("%w: empty history", ErrCorrupt)
	}
	history := make([]Entry, 0, len(w.History))
	for i, raw := range w.History {
		var pair []json.RawMessage
		if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
			return fmt.Errorf("%w: history[%d]: want [seconds, state]", ErrCorrupt, i)
		}
		var secs float64
		var name string
		if err := json.Unmarshal(pair[0], &secs); err != nil {
			return fmt.Errorf("%w: history[%d]: bad time", ErrCorrupt, i)
		}
		if err := json.Unmarshal(pair[1], &name); err != nil {
			return fmt.Errorf("%w: history[%d]: bad state", ErrCorrupt, i)
		}
		st, err := ParseState(name)
		if err != nil {
			return fmt.Errorf("%w: history[%d]: %v", ErrCorrupt, i, err)
		}
		at, err := fromUnixSeconds(secs)
		if err != nil {
			return fmt.Errorf("%w: history[%d]: %v", ErrCorrupt, i, err)
		}
		if i == 0 && st != Created {
			return fmt.Errorf("%w: history starts in %s, not %s", ErrCorrupt, st, Created)
		}
		if i > 0 && !CanTransition(history[i-1].State, st) {
			return fmt.Errorf("%w: history[%d]: %s -> %s is not a valid transition", ErrCorrupt, i, history[i-1].State, st)
		}
		history = append(history, Entry{At: at, State: st})
	}
	if last := history[len(history)-1].State; w.State != last {
		return fmt.Errorf("%w: state %q does not match the history's last state %s", ErrCorrupt, string(w.State), last)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.id = w.ExecutionID
	e.state = w.State
	e.history = history
	return nil
}
