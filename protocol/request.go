package protocol

import (
	"encoding/json"
	"fmt"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Payload is the payload of a client frame. Every payload type of this
// package embeds Header and so is one.
type Payload interface {
	SetRequestID(id string)
}

// Header holds the field every client payload may carry.
type Header struct {
	// RequestID is echoed in the reply; see ValidID.
	RequestID string `json:"request_id,omitempty"`
}

// SetRequestID implements Payload.
func (h *Header) SetRequestID(id string) { h.RequestID = id }

// EncodeRequest builds a client frame: {"action": ..., "payload": {...}}.
func EncodeRequest(action string, p Payload) ([]byte, error) {
	return json.Marshal(struct {
		Action  string  `json:"action"`
		Payload Payload `json:"payload"`
	}{action, p})
}

// Command is a submit's command: a shell script (run by bash -c) or an
// argv (run without a shell). On the wire it is a JSON string or a
// non-empty array of strings.
type Command struct {
	Shell string
	Args  []string
}

// MarshalJSON implements json.Marshaler.
func (c Command) MarshalJSON() ([]byte, error) {
	if c.Args != nil {
		return json.Marshal(c.Args)
	}
	return json.Marshal(c.Shell)
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *Command) UnmarshalJSON(b []byte) error {
	*c = Command{}
	if err := json.Unmarshal(b, &c.Shell); err == nil {
		return nil
	}
	if err := json.Unmarshal(b, &c.Args); err != nil || len(c.Args) == 0 {
		return fmt.Errorf("command is neither a string nor a non-empty list of strings: %w", ErrInvalid)
	}
	return nil
}

// Submit is the payload of submit. Fields after Cwd are additive; a
// client sends those of a feature only when the server lists it
// (Features).
type Submit struct {
	Header
	ExecutionID   string            `json:"execution_id"`
	Command       Command           `json:"command"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	TimeoutS      float64           `json:"timeout_s,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Cwd           string            `json:"cwd,omitempty"`
	// Encoding is EncodingText ("" too) or EncodingBase64.
	Encoding string                `json:"encoding,omitempty"`
	Network  *policy.NetworkPolicy `json:"network,omitempty"`
	Secrets  *secrets.Policy       `json:"secrets,omitempty"`
	// Stdin (FeatureStdin) is the whole standard input; it travels as
	// standard padded base64.
	Stdin []byte `json:"stdin,omitempty"`
	// Limits (FeatureLimits) never carries a timeout: that is TimeoutS.
	Limits *policy.ResourceLimits `json:"limits,omitempty"`
	// ResultOutput (FeatureResultOutput) is ResultOutputFull or
	// ResultOutputOmit.
	ResultOutput string   `json:"result_output,omitempty"`
	Requires     []string `json:"requires,omitempty"`
	// Inject (FeatureInject) are secrets bound to hosts (inject.go).
	Inject []Injection `json:"inject,omitempty"`
	// Workspace (FeatureWorkspace) is the workspace archive, as Upload's
	// Data: the server extracts it before anything runs, and refuses the
	// submission as an upload_artifact would refuse the upload.
	Workspace []byte `json:"workspace,omitempty"`
	// Process (FeatureProcess) starts the command as a process with a
	// handle: STARTING answers once it runs, its input comes through
	// stdin requests (Stdin must then be empty), and signal, resize and
	// dials reach it while it runs.
	Process bool `json:"process,omitempty"`
	// TTY (FeatureTTY, with Process) runs the command on a new
	// pseudo-terminal of this size inside the sandbox.
	TTY *TTYSize `json:"tty,omitempty"`
}

// ExecutionRef is the payload of cancel, status and download_artifact.
type ExecutionRef struct {
	Header
	ExecutionID string `json:"execution_id"`
}

// Attach is the payload of attach. AfterSeq is additive: events with a
// seq up to it are not sent again.
type Attach struct {
	Header
	ExecutionID string `json:"execution_id"`
	AfterSeq    int64  `json:"after_seq"`
}

// Upload is the payload of upload_artifact: Data is a workspace archive
// (see the package doc), standard padded base64 on the wire.
type Upload struct {
	Header
	ExecutionID string `json:"execution_id"`
	Data        []byte `json:"data"`
}

// Empty is the payload of reconcile and capabilities.
type Empty struct {
	Header
}
