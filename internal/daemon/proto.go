package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/pulse-agent/pulse/internal/daemon/client"
)

// The wire format's constants and the request are client's (the front
// end links that package alone).
const (
	Version    = client.Version
	MaxMessage = client.MaxMessage
	OpRun      = client.OpRun
	OpStatus   = client.OpStatus
	OpStop     = client.OpStop
)

// Limits on what a request may hold, checked by DecodeRequest.
const (
	maxArgs = 4096
	maxEnv  = 4096
)

// Commands are the pulse commands a client hands to the daemon.
var Commands = client.Commands

// Request is what a client asks of a daemon.
type Request = client.Request

// Reply is what a daemon answers.
type Reply struct {
	Accepted bool   `json:"accepted,omitempty"`
	Refused  string `json:"refused,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	Exit     *int   `json:"exit,omitempty"`
	// Status, for OpStatus.
	Status *Status `json:"status,omitempty"`
}

// Status describes a running daemon.
type Status struct {
	Pid     int    `json:"pid"`
	Dir     string `json:"dir"`
	Served  int64  `json:"served"`
	Running int    `json:"running"`
	Idle    string `json:"idle"`
}

// signalMsg forwards a signal the client got to the command.
type signalMsg struct {
	Signal int `json:"signal"`
}

// ErrBadRequest: a request that is not well formed.
var ErrBadRequest = errors.New("daemon: bad request")

// DecodeRequest parses and checks one request packet.
func DecodeRequest(data []byte) (*Request, error) {
	if len(data) > MaxMessage {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadRequest, len(data))
	}
	var r Request
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if r.V != Version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrBadRequest, r.V, Version)
	}
	switch r.Op {
	case OpRun:
		if len(r.Args) == 0 || len(r.Args) > maxArgs {
			return nil, fmt.Errorf("%w: %d arguments", ErrBadRequest, len(r.Args))
		}
	case OpStatus, OpStop:
	default:
		return nil, fmt.Errorf("%w: op %q", ErrBadRequest, r.Op)
	}
	if !filepath.IsAbs(r.Dir) || strings.IndexByte(r.Dir, 0) >= 0 {
		return nil, fmt.Errorf("%w: directory %q", ErrBadRequest, r.Dir)
	}
	if len(r.Env) > maxEnv {
		return nil, fmt.Errorf("%w: %d environment entries", ErrBadRequest, len(r.Env))
	}
	for _, kv := range r.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return nil, fmt.Errorf("%w: environment entry %q", ErrBadRequest, kv)
		}
	}
	for _, a := range r.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("%w: an argument holds NUL", ErrBadRequest)
		}
	}
	return &r, nil
}

// Getenv returns a lookup in env ("K=V" entries; the last one of a name
// wins, as for a process's environment built by appending).
func Getenv(env []string) func(string) string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}
