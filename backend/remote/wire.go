package remote

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pulse-agent/pulse/backend"
)

// Actions, reply types and statuses of the pulse-server protocol that the
// client uses. They are spelled as the server (and the Python server it
// replaces) spells them.
const (
	actionSubmit       = "submit"
	actionCancel       = "cancel"
	actionAttach       = "attach"
	actionUpload       = "upload_artifact"
	actionDownload     = "download_artifact"
	actionReconcile    = "reconcile"
	actionCapabilities = "capabilities"

	typeResponse = "response"
	typeError    = "error"
	typeStream   = "stream"
	typeResult   = "result"

	statusStarting     = "STARTING"
	statusUploaded     = "UPLOADED"
	statusNoArtifact   = "NO_ARTIFACT"
	statusDownloaded   = "DOWNLOADED"
	statusReconciled   = "RECONCILED"
	statusAttached     = "ATTACHED"
	statusRunning      = "RUNNING"
	statusCompleted    = "COMPLETED"
	statusFailed       = "FAILED"
	statusUnknown      = "UNKNOWN"
	statusNotFound     = "NOT_FOUND"
	statusCancelled    = "CANCELLED"
	statusCapabilities = "CAPABILITIES"

	codeInvalid     = "INVALID"
	codeCapacity    = "CAPACITY"
	codeUnknown     = "UNKNOWN_ACTION"
	codeUpload      = "UPLOAD_FAILED"
	codeNotFound    = "NOT_FOUND"
	codeAttached    = "ALREADY_ATTACHED"
	codeUnsupported = "UNSUPPORTED"

	// Messages of the Python server, for servers that send no code.
	msgCapacity = "Server is at maximum capacity, please try again later."
	msgUnknown  = "Unknown action."
	msgAttached = "Another client is already attached"
	msgNotFound = "NOT_FOUND"

	// Features a server lists in its capabilities reply.
	featureStdin  = "stdin"
	featureLimits = "limits"

	// errorOverlayLost is the result error of a server that ran the
	// command but could not keep its writes.
	errorOverlayLost = "OVERLAY_LOST"
	// featureResultOutput: submit takes result_output "omit", so the
	// result does not repeat output already streamed.
	featureResultOutput = "result_output"
	// featureSymlinks: uploads may hold symlinks that stay inside.
	featureSymlinks = "symlinks"
)

// errFrame is wrapped by every decoding error of a server frame.
var errFrame = errors.New("malformed server frame")

// frame is one decoded server frame. Exactly one of reply, stream and
// result is set, according to Type.
type frame struct {
	Type   string
	reply  *reply
	stream *streamEvent
	result *resultPayload
}

// reply is the payload of a response or error frame.
type reply struct {
	Status       string                `json:"status"`
	RequestID    *string               `json:"request_id"`
	ExecutionID  string                `json:"execution_id"`
	Message      string                `json:"message"`
	Code         string                `json:"code"`
	Data         string                `json:"data"`
	Executor     string                `json:"executor"`
	Capabilities *backend.Capabilities `json:"capabilities"`
	Orphans      int                   `json:"orphans_cleaned"`
	// Features and MaxStdinBytes (capabilities, additive) name the
	// additive submit fields the server honours.
	Features      []string `json:"features"`
	MaxStdinBytes int64    `json:"max_stdin_bytes"`
	isErr         bool
}

func (r *reply) requestID() string {
	if r.RequestID == nil {
		return ""
	}
	return *r.RequestID
}

// streamEvent is one chunk of output. Seq is 0 from a server that does
// not number its events (the Python server).
type streamEvent struct {
	ExecutionID string `json:"execution_id"`
	Stream      string `json:"stream"`
	Data        string `json:"data"`
	Seq         int64  `json:"seq"`
	Encoding    string `json:"encoding"`
	bytes       []byte
}

// resultPayload is how an execution ended, as the server reports it.
type resultPayload struct {
	ExecutionID       string `json:"execution_id"`
	ExitCode          int    `json:"exit_code"`
	DurationMS        int64  `json:"duration_ms"`
	TimedOut          bool   `json:"timed_out"`
	Truncated         bool   `json:"truncated"`
	PID               *int   `json:"pid"`
	TerminationReason string `json:"termination_reason"`
	Stderr            string `json:"stderr"`
	Encoding          string `json:"encoding"`
	Metrics           struct {
		MaxRSSBytes int64 `json:"max_rss_bytes"`
		UserCPUMS   int64 `json:"user_cpu_ms"`
		SystemCPUMS int64 `json:"system_cpu_ms"`
	} `json:"metrics"`
	Error    string `json:"error"`
	Artifact bool   `json:"artifact"`
	LastSeq  int64  `json:"last_seq"`
}

// parseFrame decodes a server text frame. It checks the shape only; what
// a frame means is decided by the caller. Stream data is decoded here, so
// that a bad base64 chunk is refused as a bad frame.
func parseFrame(data []byte) (*frame, error) {
	var env struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", errFrame, err)
	}
	if len(env.Payload) == 0 || string(env.Payload) == "null" || env.Payload[0] != '{' {
		return nil, fmt.Errorf("%w: %q frame without an object payload", errFrame, env.Type)
	}
	f := &frame{Type: env.Type}
	switch env.Type {
	case typeResponse, typeError:
		f.reply = &reply{}
		if err := json.Unmarshal(env.Payload, f.reply); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errFrame, env.Type, err)
		}
	case typeStream:
		s := &streamEvent{}
		if err := json.Unmarshal(env.Payload, s); err != nil {
			return nil, fmt.Errorf("%w: stream: %v", errFrame, err)
		}
		if s.Stream != "stdout" && s.Stream != "stderr" {
			return nil, fmt.Errorf("%w: stream %q", errFrame, s.Stream)
		}
		if s.Seq < 0 {
			return nil, fmt.Errorf("%w: negative seq", errFrame)
		}
		switch s.Encoding {
		case "base64":
			b, err := base64.StdEncoding.DecodeString(s.Data)
			if err != nil {
				return nil, fmt.Errorf("%w: stream data: %v", errFrame, err)
			}
			s.bytes = b
		case "", "text":
			s.bytes = []byte(s.Data)
		default:
			return nil, fmt.Errorf("%w: stream encoding %q", errFrame, s.Encoding)
		}
		s.Data = ""
		f.stream = s
	case typeResult:
		f.result = &resultPayload{}
		if err := json.Unmarshal(env.Payload, f.result); err != nil {
			return nil, fmt.Errorf("%w: result: %v", errFrame, err)
		}
	default:
		return nil, fmt.Errorf("%w: unknown type %q", errFrame, env.Type)
	}
	return f, nil
}

// request builds a client frame.
func request(action string, payload map[string]any) ([]byte, error) {
	return json.Marshal(map[string]any{"action": action, "payload": payload})
}
