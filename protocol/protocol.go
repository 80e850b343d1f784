package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"
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
	// ActionSignal, ActionStdin and ActionResize act on a process
	// submission (FeatureProcess) while it runs.
	ActionSignal = "signal"
	ActionStdin  = "stdin"
	ActionResize = "resize"
)

// Types of server frames.
const (
	TypeResponse = "response"
	TypeError    = "error"
	TypeStream   = "stream"
	TypeResult   = "result"
)

// Statuses carried by response frames (and the store's records).
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
	StatusSignalled    = "SIGNALLED"
	StatusStdin        = "STDIN"
	StatusResized      = "RESIZED"
)

// Values of a result's "error" field. The Python server had none of
// them; each is additive.
const (
	// ResultCancelled: a client cancelled the execution.
	ResultCancelled = StatusCancelled
	// ResultShutdown: the server shut down while the command ran.
	ResultShutdown = "SHUTDOWN"
	// ResultOverlayLost: the command ran but the server could not keep
	// what it wrote. The status is then FAILED, and a client must not
	// read the result as "wrote nothing".
	ResultOverlayLost = "OVERLAY_LOST"
)

// Error messages of the Python server, kept verbatim because its clients
// match on them. A client of this package matches on codes instead, and
// on these only for a server that sends no code.
const (
	MsgInvalid      = "Invalid remote protocol request."
	MsgCapacity     = "Server is at maximum capacity, please try again later."
	MsgUnknown      = "Unknown action."
	MsgUpload       = "Upload failed."
	MsgNotFound     = "NOT_FOUND"
	MsgUnauthorized = "Unauthorized"
	MsgAttached     = "Another client is already attached"
	MsgInternal     = "Remote execution failed with an internal error."
)

// Error messages of the additive process actions and dials.
const (
	MsgNotProcess = "Execution is not a process."
	MsgNotExposed = "Port is not exposed."
	MsgDialFailed = "Nothing accepted the connection inside the sandbox."
	MsgBusy       = "Another stdin request is being written."
	MsgStdinEnded = "Stdin is closed."
)

// Codes of error frames: the additive "code" field.
const (
	CodeInvalid     = "INVALID"
	CodeCapacity    = "CAPACITY"
	CodeUnknown     = "UNKNOWN_ACTION"
	CodeUpload      = "UPLOAD_FAILED"
	CodeNotFound    = "NOT_FOUND"
	CodeNotRunning  = "NOT_RUNNING"
	CodeAttached    = "ALREADY_ATTACHED"
	CodeDuplicate   = "DUPLICATE"
	CodeUnsupported = "UNSUPPORTED"
	CodeInternal    = "INTERNAL"
	// CodeNotExposed: a dial to a port the execution's network policy
	// does not list in expose.
	CodeNotExposed = "PORT_NOT_EXPOSED"
	// CodeDialFailed: nothing accepted the connection inside the
	// sandbox.
	CodeDialFailed = "DIAL_FAILED"
	// CodeBusy: another stdin request of the execution is being written;
	// the client sends again shortly.
	CodeBusy = "BUSY"
)

// Feature names of the capabilities reply: the additive fields a server
// honours. A client sends one only when the server lists it, since an
// older server ignores unknown fields silently.
const (
	// FeatureStdin: submit takes stdin.
	FeatureStdin = "stdin"
	// FeatureLimits: submit takes limits.
	FeatureLimits = "limits"
	// FeatureResultOutput: submit takes result_output "omit", so the
	// result does not repeat output already streamed.
	FeatureResultOutput = "result_output"
	// FeatureSymlinks: upload_artifact accepts symlinks that stay inside
	// the workspace.
	FeatureSymlinks = "symlinks"
	// FeatureWorkspace: submit takes workspace, the archive an
	// upload_artifact would carry, so that one request both makes the
	// workspace and starts the command.
	FeatureWorkspace = "workspace"
	// FeatureProcess: submit takes process, and the signal, stdin and
	// resize actions act on such an execution. Listed only by a server
	// whose executor keeps a handle on what it runs.
	FeatureProcess = "process"
	// FeatureTTY: submit takes tty (with process). Listed only when the
	// executor makes terminals.
	FeatureTTY = "tty"
	// FeatureDial: a WebSocket upgrade carrying HeaderDialExecution and
	// HeaderDialPort is a TCP connection to a port inside a process
	// submission's sandbox.
	FeatureDial = "dial"
)

// Features are the features the Go server lists whatever its executor,
// in its order; FeatureProcess, FeatureDial and FeatureTTY follow them
// when the executor can.
var Features = []string{FeatureStdin, FeatureLimits, FeatureResultOutput, FeatureSymlinks, FeatureInject, FeatureWorkspace}

// Bounds of submit fields. A client checks them before it sends, so that
// a request the server would refuse is refused locally.
const (
	// MaxTimeout bounds timeout_s.
	MaxTimeout = 24 * time.Hour
	// MaxCommandLen bounds the JSON of the command field.
	MaxCommandLen = 1 << 20
	// MaxEnvEntries bounds env.
	MaxEnvEntries = 1024
	// MaxCorrelation bounds correlation_id, in bytes.
	MaxCorrelation = 256
	// MaxRequires bounds requires.
	MaxRequires = 32
	// MaxCPUs bounds the cpus limit.
	MaxCPUs = 1024
	// MaxStdinBytes bounds a submit's stdin once decoded. Its base64 (a
	// third larger) stays well under the default 50 MiB message limit.
	MaxStdinBytes = 16 << 20
)

// Encodings of stream data and result output.
const (
	// EncodingText (the default, sent as "" or "text"): UTF-8, invalid
	// bytes replaced.
	EncodingText = "text"
	// EncodingBase64: standard base64 of the exact bytes.
	EncodingBase64 = "base64"
)

// Values of submit's result_output.
const (
	ResultOutputFull = "full"
	ResultOutputOmit = "omit"
)

// safeID is compiled on first use, not at package init: the {0,127}
// repeat costs ~120 KB and ~1,700 allocations, which every process
// linking this package (each pulse CLI run and its namespace init)
// would otherwise pay before main.
var safeID = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
})

// ValidID reports whether s is a valid request or execution id (and
// program name of requires).
func ValidID(s string) bool { return safeID().MatchString(s) }

// envName is the rule for env keys (compiled on first use, as safeID).
var envName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// ValidEnvName reports whether s may be a key of submit's env.
func ValidEnvName(s string) bool { return envName().MatchString(s) }

// ErrInvalid is wrapped by every validation error of a client frame.
var ErrInvalid = errors.New("invalid protocol message")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}

// decodeBase64 decodes the member name of a client frame, which must be a
// string of standard padded base64 of at most limit bytes once decoded.
// The length is judged before decoding, so an oversized member costs no
// buffer; DecodedLen counts the padding as bytes, up to 2 more than the
// data, hence the slack there and the exact check after.
func decodeBase64(name string, v json.RawMessage, limit int) ([]byte, error) {
	var b64 string
	if err := json.Unmarshal(v, &b64); err != nil {
		return nil, invalid("%s is not a base64 string", name)
	}
	if base64.StdEncoding.DecodedLen(len(b64)) > limit+2 {
		return nil, invalid("%s is longer than %d bytes", name, limit)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return nil, invalid("%s is not strict base64", name)
	}
	if len(b) > limit {
		return nil, invalid("%s is longer than %d bytes", name, limit)
	}
	return b, nil
}

// decodeStrict decodes one member of a client frame into dst, refusing
// fields dst does not have: a name the server does not know (a typo, or
// a newer client's field) must not pass as if it were honoured.
func decodeStrict(v json.RawMessage, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}
