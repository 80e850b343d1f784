package protocol

import (
	"encoding/json"
	"math"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Message is one parsed client frame.
type Message struct {
	Action  string
	Payload map[string]json.RawMessage
	// RequestID is the payload's request_id when it is valid, else "" (and
	// replies carry null, as the Python server's did).
	RequestID string
}

// ParseMessage parses a client text frame: a JSON object with a string
// "action" and an optional object "payload".
func ParseMessage(data []byte) (*Message, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, invalid("not a JSON object: %v", err)
	}
	if raw == nil {
		return nil, invalid("message is null")
	}
	m := &Message{Payload: map[string]json.RawMessage{}}
	if err := json.Unmarshal(raw["action"], &m.Action); err != nil || raw["action"] == nil {
		return nil, invalid("action is not a string")
	}
	if p, ok := raw["payload"]; ok && string(p) != "null" {
		var payload map[string]json.RawMessage
		if err := json.Unmarshal(p, &payload); err != nil || payload == nil {
			return nil, invalid("payload is not an object")
		}
		m.Payload = payload
	} else if ok {
		return nil, invalid("payload is not an object")
	}
	var rid string
	if json.Unmarshal(m.Payload["request_id"], &rid) == nil && ValidID(rid) {
		m.RequestID = rid
	}
	return m, nil
}

// ExecutionID returns the payload's execution_id, validated.
func (m *Message) ExecutionID() (string, error) {
	var id string
	if err := json.Unmarshal(m.Payload["execution_id"], &id); err != nil || !ValidID(id) {
		return "", invalid("execution_id is missing or malformed")
	}
	return id, nil
}

// SubmitRequest is a parsed submit payload.
type SubmitRequest struct {
	ExecutionID   string
	Shell         string
	Args          []string
	CorrelationID string
	Timeout       time.Duration
	Env           map[string]string
	Cwd           string
	// Encoding is "" for UTF-8 text streams, "base64" for exact bytes.
	Encoding string
	// Network and Secrets are nil when the client did not ask; the server
	// default applies then.
	Network *policy.NetworkPolicy
	Secrets *secrets.Policy
	// Requires names programs the command needs; the relay runs it only
	// on a worker whose Hello listed them all.
	Requires []string
	// Stdin is the command's whole standard input; nil when the client
	// sent none (the command then reads EOF at once, as before).
	Stdin []byte
	// Limits are the resource limits the client asked for, nil when it
	// sent none; the server clamps them (Server.effectiveLimits). Timeout
	// is always zero here: it travels as timeout_s.
	Limits *policy.ResourceLimits
	// OmitOutput leaves stdout and stderr out of the result: the client
	// takes the output from the stream events alone.
	OmitOutput bool
	// RawCommand is the command as submitted, echoed in the result.
	RawCommand json.RawMessage
	// Inject are the secrets bound to hosts (inject.go); their values
	// are never logged.
	Inject []Injection
	// Process: start the command with a handle (Submit.Process); its
	// input then comes through stdin requests.
	Process bool
	// TTY is the terminal to run a process on, nil for none.
	TTY *TTYSize
	// Workspace is the workspace archive (FeatureWorkspace), not yet
	// checked beyond its compressed size; nil when the client sent none.
	Workspace []byte
}

// ParseSubmit validates a submit payload, as the server receives it.
func ParseSubmit(p map[string]json.RawMessage) (*SubmitRequest, error) {
	r := &SubmitRequest{}
	m := &Message{Payload: p}
	id, err := m.ExecutionID()
	if err != nil {
		return nil, err
	}
	r.ExecutionID = id
	cmd, ok := p["command"]
	if !ok {
		return nil, invalid("command is missing")
	}
	if len(cmd) > MaxCommandLen {
		return nil, invalid("command is longer than %d bytes", MaxCommandLen)
	}
	r.RawCommand = cmd
	if err := json.Unmarshal(cmd, &r.Shell); err == nil {
		if strings.TrimSpace(r.Shell) == "" || strings.ContainsRune(r.Shell, 0) {
			return nil, invalid("command is empty or holds a NUL byte")
		}
	} else if err := json.Unmarshal(cmd, &r.Args); err == nil && len(r.Args) > 0 {
		for _, a := range r.Args {
			if strings.ContainsRune(a, 0) {
				return nil, invalid("command argument holds a NUL byte")
			}
		}
		if r.Args[0] == "" {
			return nil, invalid("command program is empty")
		}
	} else {
		return nil, invalid("command is neither a string nor a non-empty list of strings")
	}
	if v, ok := p["correlation_id"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.CorrelationID); err != nil || len(r.CorrelationID) > MaxCorrelation || !utf8.ValidString(r.CorrelationID) {
			return nil, invalid("correlation_id is not a short string")
		}
	}
	if v, ok := p["timeout_s"]; ok && string(v) != "null" {
		var secs float64
		if err := json.Unmarshal(v, &secs); err != nil || math.IsNaN(secs) || secs <= 0 || secs > MaxTimeout.Seconds() {
			return nil, invalid("timeout_s must be a number in (0, %v]", MaxTimeout.Seconds())
		}
		r.Timeout = time.Duration(secs * float64(time.Second))
	}
	if v, ok := p["env"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.Env); err != nil {
			return nil, invalid("env is not an object of strings")
		}
		if len(r.Env) > MaxEnvEntries {
			return nil, invalid("env has more than %d entries", MaxEnvEntries)
		}
		for k, val := range r.Env {
			if !ValidEnvName(k) || strings.ContainsRune(val, 0) {
				return nil, invalid("env entry %q is malformed", k)
			}
		}
	}
	if v, ok := p["cwd"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.Cwd); err != nil {
			return nil, invalid("cwd is not a string")
		}
		c, err := cleanCwd(r.Cwd)
		if err != nil {
			return nil, err
		}
		r.Cwd = c
	}
	if v, ok := p["encoding"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.Encoding); err != nil || (r.Encoding != "" && r.Encoding != "text" && r.Encoding != "base64") {
			return nil, invalid(`encoding must be "text" or "base64"`)
		}
		if r.Encoding == "text" {
			r.Encoding = ""
		}
	}
	if v, ok := p["stdin"]; ok && string(v) != "null" {
		in, err := decodeBase64("stdin", v, MaxStdinBytes)
		if err != nil {
			return nil, err
		}
		r.Stdin = in
	}
	if v, ok := p["workspace"]; ok && string(v) != "null" {
		ws, err := decodeBase64("workspace", v, int(DefaultMaxCompressed))
		if err != nil {
			return nil, err
		}
		if len(ws) == 0 {
			return nil, invalid("workspace is empty")
		}
		r.Workspace = ws
	}
	if v, ok := p["limits"]; ok && string(v) != "null" {
		var l policy.ResourceLimits
		if err := decodeStrict(v, &l); err != nil {
			return nil, invalid("limits is not an object of resource limits")
		}
		if l.Timeout != 0 {
			return nil, invalid("limits.timeout is not accepted: send timeout_s")
		}
		if l.MemoryBytes < 0 || l.Pids < 0 || l.OutputBytes < 0 || l.FileSizeBytes < 0 || l.DiskBytes < 0 ||
			math.IsNaN(l.CPUs) || l.CPUs < 0 || l.CPUs > MaxCPUs {
			return nil, invalid("limits must be non-negative (cpus at most %d)", MaxCPUs)
		}
		r.Limits = &l
	}
	if v, ok := p["result_output"]; ok && string(v) != "null" {
		var mode string
		if err := json.Unmarshal(v, &mode); err != nil || (mode != "full" && mode != "omit") {
			return nil, invalid(`result_output must be "full" or "omit"`)
		}
		r.OmitOutput = mode == "omit"
	}
	if v, ok := p["requires"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.Requires); err != nil || len(r.Requires) > MaxRequires {
			return nil, invalid("requires must be a list of at most %d program names", MaxRequires)
		}
		for _, name := range r.Requires {
			if !ValidID(name) {
				return nil, invalid("requires entry %q is not a program name", name)
			}
		}
	}
	if v, ok := p["process"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.Process); err != nil {
			return nil, invalid("process is not a boolean")
		}
		if r.Process && r.Stdin != nil {
			return nil, invalid("a process takes its input through stdin requests, not the stdin field")
		}
	}
	if v, ok := p["tty"]; ok && string(v) != "null" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
			return nil, invalid("tty is not an object")
		}
		sz, err := parseTTY(obj)
		if err != nil {
			return nil, err
		}
		if !r.Process {
			return nil, invalid("tty needs process")
		}
		r.TTY = &sz
	}
	if v, ok := p["network"]; ok && string(v) != "null" {
		var np policy.NetworkPolicy
		if err := decodeStrict(v, &np); err != nil {
			return nil, invalid("network is not a network policy")
		}
		if !np.Mode.Valid() {
			return nil, invalid("network mode %q is unknown", np.Mode)
		}
		r.Network = &np
	}
	if v, ok := p["secrets"]; ok && string(v) != "null" {
		var sp secrets.Policy
		if err := decodeStrict(v, &sp); err != nil {
			return nil, invalid("secrets is not a secret policy")
		}
		if !sp.Mode.Valid() {
			return nil, invalid("secrets mode %q is unknown", sp.Mode)
		}
		r.Secrets = &sp
	}
	if v, ok := p["inject"]; ok && string(v) != "null" {
		if r.Inject, err = parseInject(v); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// cleanCwd accepts a relative path that stays inside the workspace and is
// not under the reserved .pulse directory.
func cleanCwd(c string) (string, error) {
	if c == "" {
		return ".", nil
	}
	if strings.ContainsRune(c, 0) || strings.HasPrefix(c, "/") || strings.Contains(c, "\\") || len(c) > pathguard.MaxPathLen {
		return "", invalid("cwd must be a relative path inside the workspace")
	}
	for _, part := range strings.Split(c, "/") {
		if part == ".." {
			return "", invalid("cwd must not contain ..")
		}
	}
	c = path.Clean(c)
	if pathguard.IsReserved(c) {
		return "", invalid("cwd is reserved")
	}
	return c, nil
}
