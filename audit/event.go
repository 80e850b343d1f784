package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pulse-agent/pulse/secrets"
)

// Event is one line of the audit log. The json tags are the schema
// documented in SCHEMA.md; the names match the Python logger's, so existing
// consumers keep working.
//
// Time, Seq, PrevHash and Hash are set by Logger.Record (a zero Time is
// replaced by the current time); the other fields are the caller's.
type Event struct {
	Time           time.Time `json:"time"`
	Seq            uint64    `json:"seq"`
	SessionID      string    `json:"session_id,omitempty"`
	ExecutionID    string    `json:"execution_id,omitempty"`
	Action         string    `json:"action"`
	Target         string    `json:"target,omitempty"`
	Decision       string    `json:"decision,omitempty"`
	IsolationLevel string    `json:"isolation_level,omitempty"`
	Detail         string    `json:"detail,omitempty"`
	// ExitCode is a pointer because 0 is a meaningful exit code; use Int.
	ExitCode    *int    `json:"exit_code,omitempty"`
	DurationMS  float64 `json:"duration_ms,omitempty"`
	ContainerID string  `json:"container_id,omitempty"`
	Reason      string  `json:"reason,omitempty"`
	// Network events.
	Destination      string `json:"destination,omitempty"`
	Port             int    `json:"port,omitempty"`
	Protocol         string `json:"protocol,omitempty"`
	EnforcementLevel string `json:"enforcement_level,omitempty"`
	Backend          string `json:"backend,omitempty"`
	// Review events: who decided (the OS user), through which entry
	// point (sdk, cli, review-page), on which transaction, and the
	// SHA-256 of the content a write puts (or put) at Target.
	Actor         string `json:"actor,omitempty"`
	Via           string `json:"via,omitempty"`
	TxID          string `json:"tx_id,omitempty"`
	ContentSHA256 string `json:"sha256,omitempty"`
	// Chain. KeyID names the key of a keyed chain (hash is then an
	// HMAC); the Logger sets it.
	KeyID    string `json:"key_id,omitempty"`
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

// Int returns a pointer to v, for Event.ExitCode.
func Int(v int) *int { return &v }

// TimeFormat is how Event.Time is written: RFC 3339, UTC, nanoseconds,
// fixed width so that lines sort as text.
const TimeFormat = "2006-01-02T15:04:05.000000000Z"

// GenesisHash is the prev_hash of the first event of a log.
const GenesisHash = "0000000000000000000000000000000000000000000000000000000000000000"

// wireEvent is how an Event is written: Event's own members in Event's
// order, except that time is the fixed-width UTC string and hash is left
// out, because it is appended by hand so that the bytes it covers are
// exactly the bytes before it. The outer fields hide Event's of the same
// name (encoding/json: the shallower field wins). Event must not get a
// MarshalJSON method: wireEvent would inherit it.
type wireEvent struct {
	Time string `json:"time"`
	*Event
	Hash *struct{} `json:"hash,omitempty"` // always nil
}

// scrub passes every free-text field through s.
func (e *Event) scrub(s *secrets.Scrubber) {
	for _, p := range []*string{&e.SessionID, &e.ExecutionID, &e.Action, &e.Target, &e.Decision,
		&e.IsolationLevel, &e.Detail, &e.ContainerID, &e.Reason, &e.Destination, &e.Protocol,
		&e.EnforcementLevel, &e.Backend, &e.Actor, &e.Via, &e.TxID, &e.ContentSHA256} {
		*p = s.Redact(*p)
	}
}

// canonical returns the bytes the hash covers: the line's JSON object
// without its final "hash" member.
func (e *Event) canonical() ([]byte, error) {
	w := wireEvent{Time: e.Time.UTC().Format(TimeFormat), Event: e}
	return json.Marshal(&w)
}

const hashKey = `,"hash":"`

// hashLen is the length of a hex SHA-256.
const hashLen = 64

// splitLine takes a line (without its newline) apart into the canonical
// bytes and the hash it claims. The line must end with the hash member.
func splitLine(line []byte) (canonical []byte, hash string, ok bool) {
	tail := len(hashKey) + hashLen + len(`"}`)
	if len(line) < tail+1 || !bytes.HasSuffix(line, []byte(`"}`)) {
		return nil, "", false
	}
	k := len(line) - tail
	if !bytes.Equal(line[k:k+len(hashKey)], []byte(hashKey)) {
		return nil, "", false
	}
	h := line[k+len(hashKey) : len(line)-2]
	if !isHex(h) {
		return nil, "", false
	}
	c := make([]byte, 0, k+1)
	c = append(c, line[:k]...)
	c = append(c, '}')
	return c, string(h), true
}

func isHex(b []byte) bool {
	if len(b) != hashLen {
		return false
	}
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ErrMalformed: a line is not an audit event (not JSON, or missing the
// chain fields). Test with errors.Is.
var ErrMalformed = errors.New("malformed audit line")

// ParseLine decodes one line of the log (with or without its newline). It
// checks the shape, not the chain: use Verify for that.
func ParseLine(line []byte) (Event, error) {
	line = bytes.TrimSuffix(line, []byte("\n"))
	// Pointers tell a missing chain field from a zero one; they hide
	// Event's fields of the same name.
	var w struct {
		Event
		Time     *string `json:"time"`
		Seq      *uint64 `json:"seq"`
		PrevHash *string `json:"prev_hash"`
		Hash     *string `json:"hash"`
	}
	if err := json.Unmarshal(line, &w); err != nil {
		return Event{}, fmt.Errorf("%w: not a JSON object: %v", ErrMalformed, err)
	}
	if w.Time == nil || w.Seq == nil || w.PrevHash == nil || w.Hash == nil {
		return Event{}, fmt.Errorf("%w: missing time, seq, prev_hash or hash", ErrMalformed)
	}
	ts, err := time.Parse(time.RFC3339Nano, *w.Time)
	if err != nil {
		return Event{}, fmt.Errorf("%w: bad time %q", ErrMalformed, *w.Time)
	}
	e := w.Event
	e.Time, e.Seq, e.PrevHash, e.Hash = ts, *w.Seq, *w.PrevHash, *w.Hash
	return e, nil
}
