package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/pulse-agent/pulse/backend"
)

// Reply is the payload of a response or an error frame, with the fields a
// client reads.
type Reply struct {
	Status    string  `json:"status"`
	RequestID *string `json:"request_id"`
	// ExecutionID: replies about one execution (additive on most).
	ExecutionID string `json:"execution_id"`
	// Message and Code: error frames (Code additive).
	Message string `json:"message"`
	Code    string `json:"code"`
	// Data: download_artifact's overlay archive, base64.
	Data string `json:"data"`
	// Executor, Capabilities, Features, MaxStdinBytes: capabilities.
	Executor      string                `json:"executor"`
	Capabilities  *backend.Capabilities `json:"capabilities"`
	Features      []string              `json:"features"`
	MaxStdinBytes int64                 `json:"max_stdin_bytes"`
	// Orphans: reconcile.
	Orphans int `json:"orphans_cleaned"`
	// Received: stdin, how many bytes of input the server has taken.
	Received int64 `json:"received"`
}

// RequestIDOf returns the request id the reply echoes, "" for null.
func (r *Reply) RequestIDOf() string {
	if r.RequestID == nil {
		return ""
	}
	return *r.RequestID
}

// StreamEvent is the payload of a stream frame: one chunk of output. Seq
// (additive) is 0 from a server that does not number its events (the
// Python server).
type StreamEvent struct {
	ExecutionID string `json:"execution_id"`
	Stream      string `json:"stream"`
	Data        string `json:"data"`
	Seq         int64  `json:"seq"`
	Encoding    string `json:"encoding,omitempty"`
	// Bytes is Data decoded, set by ParseFrame (which then clears Data).
	Bytes []byte `json:"-"`
}

// Result is the payload of a result frame: the process result as the
// Python server's ProcessResult.to_dict() sent it, plus additive fields.
type Result struct {
	ExecutionID       string          `json:"execution_id"`
	Command           json.RawMessage `json:"command"`
	ExitCode          int             `json:"exit_code"`
	Stdout            string          `json:"stdout"`
	Stderr            string          `json:"stderr"`
	Encoding          string          `json:"encoding,omitempty"`
	DurationMS        int64           `json:"duration_ms"`
	TimedOut          bool            `json:"timed_out"`
	Truncated         bool            `json:"truncated"`
	PID               *int            `json:"pid"`
	TerminationReason string          `json:"termination_reason"`
	Metrics           ResultMetrics   `json:"metrics"`
	// Error is one of the Result* values (additive).
	Error string `json:"error,omitempty"`
	// ErrorCode (additive) is the class of what went wrong: set when
	// TerminationReason is "error" (nothing ran) or Error is
	// ResultOverlayLost. See CodeOf and ErrorOf.
	ErrorCode     string `json:"error_code,omitempty"`
	Artifact      bool   `json:"artifact"`
	LastSeq       int64  `json:"last_seq"`
	OutputOmitted bool   `json:"output_omitted,omitempty"`
	// Network (FeatureInject) are the connections through the server's
	// egress proxy, at most MaxNetworkEvents; NetworkDropped counts the
	// rest.
	Network        []NetworkEvent `json:"network,omitempty"`
	NetworkDropped int            `json:"network_dropped,omitempty"`
}

// ResultMetrics are a result's resource measurements.
type ResultMetrics struct {
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	UserCPUMS   int64 `json:"user_cpu_ms"`
	SystemCPUMS int64 `json:"system_cpu_ms"`
}

// ErrFrame is wrapped by every decoding error of a server frame.
var ErrFrame = errors.New("malformed server frame")

// Frame is one decoded server frame. Exactly one of Reply, Stream and
// Result is set, according to Type.
type Frame struct {
	Type   string
	Reply  *Reply
	Stream *StreamEvent
	Result *Result
}

// ParseFrame decodes a server text frame, as a client receives it. It
// checks the shape only; what a frame means is decided by the caller.
// Stream data is decoded here (into StreamEvent.Bytes), so that a bad
// base64 chunk is refused as a bad frame.
func ParseFrame(data []byte) (*Frame, error) {
	var env struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFrame, err)
	}
	if len(env.Payload) == 0 || string(env.Payload) == "null" || env.Payload[0] != '{' {
		return nil, fmt.Errorf("%w: %q frame without an object payload", ErrFrame, env.Type)
	}
	f := &Frame{Type: env.Type}
	switch env.Type {
	case TypeResponse, TypeError:
		f.Reply = &Reply{}
		if err := json.Unmarshal(env.Payload, f.Reply); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrFrame, env.Type, err)
		}
	case TypeStream:
		s := &StreamEvent{}
		if err := json.Unmarshal(env.Payload, s); err != nil {
			return nil, fmt.Errorf("%w: stream: %v", ErrFrame, err)
		}
		if s.Stream != "stdout" && s.Stream != "stderr" {
			return nil, fmt.Errorf("%w: stream %q", ErrFrame, s.Stream)
		}
		if s.Seq < 0 {
			return nil, fmt.Errorf("%w: negative seq", ErrFrame)
		}
		switch s.Encoding {
		case EncodingBase64:
			b, err := base64.StdEncoding.DecodeString(s.Data)
			if err != nil {
				return nil, fmt.Errorf("%w: stream data: %v", ErrFrame, err)
			}
			s.Bytes = b
		case "", EncodingText:
			s.Bytes = []byte(s.Data)
		default:
			return nil, fmt.Errorf("%w: stream encoding %q", ErrFrame, s.Encoding)
		}
		s.Data = ""
		f.Stream = s
	case TypeResult:
		f.Result = &Result{}
		if err := json.Unmarshal(env.Payload, f.Result); err != nil {
			return nil, fmt.Errorf("%w: result: %v", ErrFrame, err)
		}
	default:
		return nil, fmt.Errorf("%w: unknown type %q", ErrFrame, env.Type)
	}
	return f, nil
}

// envelope is a server frame.
type envelope struct {
	Type    string `json:"type"`
	Payload any    `json:"payload"`
}

// EncodeFrame builds a server frame of type typ around payload.
func EncodeFrame(typ string, payload any) []byte {
	b, err := json.Marshal(envelope{Type: typ, Payload: payload})
	if err != nil {
		// Every payload is built from plain maps, strings and the
		// structs of this package; a failure here is a programming
		// error, answered as an internal error.
		b, _ = json.Marshal(envelope{Type: TypeError, Payload: map[string]any{"message": MsgInternal, "code": CodeInternal}})
	}
	return b
}

// RawFrame wraps a payload that is already JSON without re-encoding it:
// a result can hold megabytes of output, and encoding/json would validate
// and copy it again. Clients' fast paths expect the frame to start with
// {"type":"result".
func RawFrame(typ string, payload []byte) []byte {
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

// ResponseFrame builds a response frame: status, request_id and extra.
func ResponseFrame(requestID, status string, extra map[string]any) []byte {
	p := map[string]any{"status": status, "request_id": rid(requestID)}
	for k, v := range extra {
		p[k] = v
	}
	return EncodeFrame(TypeResponse, p)
}

// ErrorFrame builds an error frame.
func ErrorFrame(requestID, message, code string) []byte {
	return EncodeFrame(TypeError, map[string]any{"message": message, "request_id": rid(requestID), "code": code})
}

// StreamFrame builds a stream frame by hand: it is the one frame sent per
// chunk of output, and encoding/json would build the data string and then
// scan and copy it again. data is valid UTF-8 text or, with encoding
// EncodingBase64, raw bytes. The field order is the one encoding/json
// gives StreamEvent, and clients' fast paths (backend/remote's
// fastStream) expect exactly this form.
func StreamFrame(execID, stream string, data []byte, seq int64, encoding string) []byte {
	n := len(execID) + len(stream) + 96
	if encoding == EncodingBase64 {
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
	if encoding == EncodingBase64 {
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
