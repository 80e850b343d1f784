package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Version is the wire format's version; a daemon refuses any other.
const Version = 1

// MaxMessage bounds one message on the socket. A request that does not
// fit (an environment of more than ~190 KiB) is run in-process.
const MaxMessage = 192 << 10

// Limits on what a request may hold, checked by DecodeRequest.
const (
	maxArgs = 4096
	maxEnv  = 4096
)

// Commands are the pulse commands a client hands to the daemon (pulse
// and its front end alike); every other command runs in the client.
var Commands = []string{"exec", "cow", "mcp", "review"}

// The request's operations.
const (
	OpRun    = "run"
	OpStatus = "status"
	OpStop   = "stop"
)

// Request is what a client asks of a daemon.
type Request struct {
	V  int    `json:"v"`
	Op string `json:"op"`
	// Args are the command's arguments after the program name
	// ("exec", "--", "true"); Prog is how the user started pulse, for
	// the hints it prints.
	Args []string `json:"args,omitempty"`
	Prog string   `json:"prog,omitempty"`
	// Dir is the client's working directory, Env its environment: both
	// must be the daemon's (see Name).
	Dir string   `json:"dir"`
	Env []string `json:"env,omitempty"`
}

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
