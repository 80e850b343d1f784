package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Actions a client may send.
const (
	ActionSubmit       = "submit"
	ActionCancel       = "cancel"
	ActionStatus       = "status"
	ActionAttach       = "attach"
	ActionUpload       = "upload_artifact"
	ActionDownload     = "download_artifact"
	ActionReconcile    = "reconcile"
	ActionCapabilities = "capabilities"
)

// Reply types.
const (
	TypeResponse = "response"
	TypeError    = "error"
	TypeStream   = "stream"
	TypeResult   = "result"
)

// Statuses carried by replies.
const (
	StatusStarting     = "STARTING"
	StatusCancelled    = "CANCELLED"
	StatusUploaded     = "UPLOADED"
	StatusNoArtifact   = "NO_ARTIFACT"
	StatusDownloaded   = "DOWNLOADED"
	StatusReconciled   = "RECONCILED"
	StatusNotFound     = "NOT_FOUND"
	StatusAttached     = "ATTACHED"
	StatusRunning      = "RUNNING"
	StatusCompleted    = "COMPLETED"
	StatusFailed       = "FAILED"
	StatusUnknown      = "UNKNOWN"
	StatusCapabilities = "CAPABILITIES"
)

// ErrorOverlayLost is a result's error when the command ran but the server
// could not keep what it wrote (an additive value: the Python server had
// no such case). The result's status is then FAILED.
const ErrorOverlayLost = "OVERLAY_LOST"

// Error messages of the Python server, kept verbatim because clients match
// on them.
const (
	msgInvalid     = "Invalid remote protocol request."
	msgCapacity    = "Server is at maximum capacity, please try again later."
	msgUnknown     = "Unknown action."
	msgUpload      = "Upload failed."
	msgNotFound    = "NOT_FOUND"
	msgUnauthorize = "Unauthorized"
	msgAttached    = "Another client is already attached"
	msgInternal    = "Remote execution failed with an internal error."
)

// Error codes: an additive machine-readable field on error replies.
const (
	codeInvalid     = "INVALID"
	codeCapacity    = "CAPACITY"
	codeUnknown     = "UNKNOWN_ACTION"
	codeUpload      = "UPLOAD_FAILED"
	codeNotFound    = "NOT_FOUND"
	codeNotRunning  = "NOT_RUNNING"
	codeAttached    = "ALREADY_ATTACHED"
	codeDuplicate   = "DUPLICATE"
	codeUnsupported = "UNSUPPORTED"
	codeInternal    = "INTERNAL"
)

// Bounds of submit fields.
const (
	maxTimeout     = 24 * time.Hour
	maxCommandLen  = 1 << 20
	maxEnvEntries  = 1024
	maxCorrelation = 256
	maxRequires    = 32
	// MaxStdinBytes bounds a submit's stdin once decoded. Its base64 (a
	// third larger) stays well under the default 50 MiB message limit.
	MaxStdinBytes = 16 << 20
)

// Features are the additive submit fields this server understands,
// listed in the capabilities reply so that a client uses one only when
// the server will honour it.
var Features = []string{FeatureStdin, FeatureLimits, FeatureResultOutput, FeatureSymlinks}

// Feature names of the capabilities reply.
const (
	FeatureStdin  = "stdin"
	FeatureLimits = "limits"
	// FeatureResultOutput: submit takes result_output "omit".
	FeatureResultOutput = "result_output"
	// FeatureSymlinks: upload_artifact accepts symlinks that stay inside
	// the workspace.
	FeatureSymlinks = "symlinks"
)

// maxCPUs bounds the cpus limit a submit may ask for.
const maxCPUs = 1024

var safeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidID reports whether s is a valid request or execution id.
func ValidID(s string) bool { return safeID.MatchString(s) }

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ErrInvalid is wrapped by every protocol validation error.
var ErrInvalid = errors.New("invalid protocol message")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}

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
	Secrets *secrets.SecretPolicy
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
	// command is the command as submitted, echoed in the result.
	command json.RawMessage
}

// ParseSubmit validates a submit payload.
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
	if len(cmd) > maxCommandLen {
		return nil, invalid("command is longer than %d bytes", maxCommandLen)
	}
	r.command = cmd
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
		if err := json.Unmarshal(v, &r.CorrelationID); err != nil || len(r.CorrelationID) > maxCorrelation || !utf8.ValidString(r.CorrelationID) {
			return nil, invalid("correlation_id is not a short string")
		}
	}
	if v, ok := p["timeout_s"]; ok && string(v) != "null" {
		var secs float64
		if err := json.Unmarshal(v, &secs); err != nil || math.IsNaN(secs) || secs <= 0 || secs > maxTimeout.Seconds() {
			return nil, invalid("timeout_s must be a number in (0, %v]", maxTimeout.Seconds())
		}
		r.Timeout = time.Duration(secs * float64(time.Second))
	}
	if v, ok := p["env"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.Env); err != nil {
			return nil, invalid("env is not an object of strings")
		}
		if len(r.Env) > maxEnvEntries {
			return nil, invalid("env has more than %d entries", maxEnvEntries)
		}
		for k, val := range r.Env {
			if !envName.MatchString(k) || strings.ContainsRune(val, 0) {
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
		var b64 string
		if err := json.Unmarshal(v, &b64); err != nil {
			return nil, invalid("stdin is not a base64 string")
		}
		if base64.StdEncoding.DecodedLen(len(b64)) > MaxStdinBytes+2 {
			return nil, invalid("stdin is longer than %d bytes", MaxStdinBytes)
		}
		in, err := base64.StdEncoding.Strict().DecodeString(b64)
		if err != nil {
			return nil, invalid("stdin is not strict base64")
		}
		if len(in) > MaxStdinBytes {
			return nil, invalid("stdin is longer than %d bytes", MaxStdinBytes)
		}
		r.Stdin = in
	}
	if v, ok := p["limits"]; ok && string(v) != "null" {
		var l policy.ResourceLimits
		dec := json.NewDecoder(strings.NewReader(string(v)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, invalid("limits is not an object of resource limits")
		}
		if l.Timeout != 0 {
			return nil, invalid("limits.timeout is not accepted: send timeout_s")
		}
		if l.MemoryBytes < 0 || l.Pids < 0 || l.OutputBytes < 0 || l.FileSizeBytes < 0 ||
			math.IsNaN(l.CPUs) || l.CPUs < 0 || l.CPUs > maxCPUs {
			return nil, invalid("limits must be non-negative (cpus at most %d)", maxCPUs)
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
		if err := json.Unmarshal(v, &r.Requires); err != nil || len(r.Requires) > maxRequires {
			return nil, invalid("requires must be a list of at most %d program names", maxRequires)
		}
		for _, name := range r.Requires {
			if !ValidID(name) {
				return nil, invalid("requires entry %q is not a program name", name)
			}
		}
	}
	if v, ok := p["network"]; ok && string(v) != "null" {
		var np policy.NetworkPolicy
		dec := json.NewDecoder(strings.NewReader(string(v)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&np); err != nil {
			return nil, invalid("network is not a network policy")
		}
		switch np.Mode {
		case policy.NetworkDenyAll, policy.NetworkAllowAll, policy.NetworkAllowlist:
		default:
			return nil, invalid("network mode %q is unknown", np.Mode)
		}
		r.Network = &np
	}
	if v, ok := p["secrets"]; ok && string(v) != "null" {
		var sp secrets.SecretPolicy
		dec := json.NewDecoder(strings.NewReader(string(v)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sp); err != nil {
			return nil, invalid("secrets is not a secret policy")
		}
		switch sp.Mode {
		case secrets.DenyAll, secrets.AllowAll, secrets.Allowlist:
		default:
			return nil, invalid("secrets mode %q is unknown", sp.Mode)
		}
		r.Secrets = &sp
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

// envelope is a server frame.
type envelope struct {
	Type    string `json:"type"`
	Payload any    `json:"payload"`
}

func frame(typ string, payload any) []byte {
	b, err := json.Marshal(envelope{Type: typ, Payload: payload})
	if err != nil {
		// Every payload is built from plain maps and strings; a failure
		// here is a programming error, answered as an internal error.
		b, _ = json.Marshal(envelope{Type: TypeError, Payload: map[string]any{"message": msgInternal, "code": codeInternal}})
	}
	return b
}

// rawFrame wraps a payload that is already JSON without re-encoding it:
// a result can hold megabytes of output, and encoding/json would validate
// and copy it again.
func rawFrame(typ string, payload []byte) []byte {
	b := make([]byte, 0, len(payload)+len(typ)+24)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","payload":`...)
	b = append(b, payload...)
	return append(b, '}')
}

// rid renders a request id: null when absent or invalid.
func rid(id string) any {
	if id == "" {
		return nil
	}
	return id
}

func responseFrame(requestID, status string, extra map[string]any) []byte {
	p := map[string]any{"status": status, "request_id": rid(requestID)}
	for k, v := range extra {
		p[k] = v
	}
	return frame(TypeResponse, p)
}

func errorFrame(requestID, message, code string) []byte {
	return frame(TypeError, map[string]any{"message": message, "request_id": rid(requestID), "code": code})
}

// streamPayload is a stream event as sent on the wire.
type streamPayload struct {
	ExecutionID string `json:"execution_id"`
	Stream      string `json:"stream"`
	Data        string `json:"data"`
	Seq         int64  `json:"seq"`
	Encoding    string `json:"encoding,omitempty"`
}

// streamFrame builds a stream frame by hand: it is the one frame sent
// per chunk of output, and encoding/json would build the data string and
// then scan and copy it again. The field order is the one encoding/json
// gives streamPayload, which clients' fast paths expect.
func streamFrame(execID, stream string, data []byte, seq int64, encoding string) []byte {
	n := len(execID) + len(stream) + 96
	if encoding == "base64" {
		n += base64.StdEncoding.EncodedLen(len(data))
	} else {
		n += len(data) + len(data)/8
	}
	b := make([]byte, 0, n)
	b = append(b, `{"type":"stream","payload":{"execution_id":`...)
	b = appendJSONString(b, execID)
	b = append(b, `,"stream":`...)
	b = appendJSONString(b, stream)
	b = append(b, `,"data":"`...)
	if encoding == "base64" {
		b = base64.StdEncoding.AppendEncode(b, data)
	} else {
		b = appendJSONText(b, data)
	}
	b = append(b, `","seq":`...)
	b = strconv.AppendInt(b, seq, 10)
	if encoding != "" {
		b = append(b, `,"encoding":`...)
		b = appendJSONString(b, encoding)
	}
	return append(b, "}}"...)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONText(b, []byte(s))
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONText appends the JSON string escape of valid UTF-8 text,
// without the quotes. Runs that need no escape are copied whole. U+2028
// and U+2029 are escaped as encoding/json does, so the frame is also
// valid JavaScript.
func appendJSONText(b, s []byte) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c != 0xe2 {
			i++
			continue
		}
		if c == 0xe2 {
			if i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xa8 || s[i+2] == 0xa9) {
				b = append(b, s[start:i]...)
				b = append(b, `\u202`...)
				b = append(b, hexDigits[s[i+2]&0xf])
				i += 3
				start = i
				continue
			}
			i++
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	return append(b, s[start:]...)
}

// toText decodes b as UTF-8, replacing each invalid byte with U+FFFD as
// Python's decode(errors="replace") does.
func toText(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
			b = b[1:]
			continue
		}
		out = append(out, b[:n]...)
		b = b[n:]
	}
	return out
}

// splitUTF8 returns the longest prefix of b that does not end inside a
// multi-byte sequence that the next chunk could still complete, and the
// rest. Holding that rest back keeps a character split across two reads
// intact instead of turning it into two replacement characters.
func splitUTF8(b []byte) (head, tail []byte) {
	for k := 1; k <= utf8.UTFMax-1 && k <= len(b); k++ {
		c := b[len(b)-k]
		if c < utf8.RuneSelf {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-k:]) {
				return b[:len(b)-k], b[len(b)-k:]
			}
			break
		}
	}
	return b, nil
}
