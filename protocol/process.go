package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Headers of a dial: a WebSocket upgrade that carries both is not a
// protocol connection but one TCP connection to a port inside a process
// submission's sandbox, its bytes in binary messages both ways
// (FeatureDial).
const (
	HeaderDialExecution = "Pulse-Dial-Execution"
	HeaderDialPort      = "Pulse-Dial-Port"
)

// Capabilities on connect (additive): a client that sends
// HeaderCapabilities with the value CapabilitiesAsk on its WebSocket
// upgrade is answered, in the same header of the 101 response, with what
// the capabilities action would answer — the response payload's JSON in
// standard padded base64 — so that its first request on the connection
// need not be that one. A server that does not know the header answers
// the upgrade without it, and the client asks with the action as before;
// one that is not asked never sends it, so the wire of other clients is
// unchanged.
const (
	HeaderCapabilities = "Pulse-Capabilities"
	CapabilitiesAsk    = "1"
	// MaxCapabilitiesHeader bounds the header value a client decodes:
	// a capabilities answer is a few KiB.
	MaxCapabilitiesHeader = 64 << 10
	// MaxCapabilitiesHeaderSent bounds the value a server sends: a
	// reverse proxy holds a response's headers in a buffer of its own
	// (nginx's proxy_buffer_size, 4 KiB by default) and fails the
	// upgrade on a larger one, where a missing header would only cost
	// the round trip.
	MaxCapabilitiesHeaderSent = 3 << 10
)

// ErrHeaderTooLarge: a capabilities answer too large for
// HeaderCapabilities; the client is left to ask with the action.
var ErrHeaderTooLarge = errors.New("protocol: capabilities answer too large for the header")

// CapabilitiesHeader encodes a capabilities answer (the payload of the
// action's response, status included) as HeaderCapabilities' value, or
// fails with ErrHeaderTooLarge past MaxCapabilitiesHeaderSent.
func CapabilitiesHeader(payload map[string]any) (string, error) {
	b, err := json.Marshal(payload)
	if err != nil {
		return "", err
	}
	v := base64.StdEncoding.EncodeToString(b)
	if len(v) > MaxCapabilitiesHeaderSent {
		return "", fmt.Errorf("%w: %d bytes", ErrHeaderTooLarge, len(v))
	}
	return v, nil
}

// ParseCapabilitiesHeader decodes HeaderCapabilities' value into the
// reply the capabilities action would have given. Like ParseFrame it
// checks the shape only: a CAPABILITIES status and a capabilities
// object; errors wrap ErrFrame.
func ParseCapabilitiesHeader(v string) (*Reply, error) {
	if len(v) > MaxCapabilitiesHeader {
		return nil, fmt.Errorf("%w: %s header of %d bytes", ErrFrame, HeaderCapabilities, len(v))
	}
	b, err := base64.StdEncoding.Strict().DecodeString(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %s header: %v", ErrFrame, HeaderCapabilities, err)
	}
	if len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("%w: %s header is not an object", ErrFrame, HeaderCapabilities)
	}
	r := &Reply{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%w: %s header: %v", ErrFrame, HeaderCapabilities, err)
	}
	if r.Status != StatusCapabilities || r.Capabilities == nil {
		return nil, fmt.Errorf("%w: %s header answers %q without capabilities", ErrFrame, HeaderCapabilities, r.Status)
	}
	return r, nil
}

// MaxStdinChunk bounds the data of one stdin request once decoded. A
// client sends larger input as several requests.
const MaxStdinChunk = 1 << 20

// TTYSize is a terminal's size: submit's tty and resize's payload.
type TTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Signal is the payload of signal. Signal is a name of Signals.
type Signal struct {
	Header
	ExecutionID string `json:"execution_id"`
	Signal      string `json:"signal"`
}

// Stdin is the payload of stdin: Data is the process's input from byte
// Offset on (standard padded base64 on the wire), EOF closes it after
// Data. The server skips what it has already received before Offset, so
// a request sent again after a lost connection delivers nothing twice.
type Stdin struct {
	Header
	ExecutionID string `json:"execution_id"`
	Offset      int64  `json:"offset"`
	Data        []byte `json:"data,omitempty"`
	EOF         bool   `json:"eof,omitempty"`
}

// Resize is the payload of resize.
type Resize struct {
	Header
	ExecutionID string `json:"execution_id"`
	TTYSize
}

// Signals are the signals a client may send by name (without "SIG"): the
// ones a command is commonly stopped, woken or told something with.
var Signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "ALRM": syscall.SIGALRM,
	"CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP, "WINCH": syscall.SIGWINCH,
}

// SignalName is the wire name of sig, false for a signal Signals lacks.
func SignalName(sig os.Signal) (string, bool) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return "", false
	}
	for name, v := range Signals {
		if v == s {
			return name, true
		}
	}
	return "", false
}

// SignalRequest is a parsed signal payload.
type SignalRequest struct {
	ExecutionID string
	Signal      syscall.Signal
}

// ParseSignal validates a signal payload.
func ParseSignal(p map[string]json.RawMessage) (*SignalRequest, error) {
	id, err := (&Message{Payload: p}).ExecutionID()
	if err != nil {
		return nil, err
	}
	var name string
	if err := json.Unmarshal(p["signal"], &name); err != nil {
		return nil, invalid("signal is not a string")
	}
	sig, ok := Signals[strings.TrimPrefix(name, "SIG")]
	if !ok {
		return nil, invalid("signal %q is not one a client may send", name)
	}
	return &SignalRequest{ExecutionID: id, Signal: sig}, nil
}

// StdinRequest is a parsed stdin payload.
type StdinRequest struct {
	ExecutionID string
	Offset      int64
	Data        []byte
	EOF         bool
}

// ParseStdin validates a stdin payload.
func ParseStdin(p map[string]json.RawMessage) (*StdinRequest, error) {
	id, err := (&Message{Payload: p}).ExecutionID()
	if err != nil {
		return nil, err
	}
	r := &StdinRequest{ExecutionID: id}
	if err := json.Unmarshal(p["offset"], &r.Offset); err != nil || r.Offset < 0 {
		return nil, invalid("offset must be a non-negative integer")
	}
	if v, ok := p["data"]; ok && string(v) != "null" {
		if r.Data, err = decodeBase64("data", v, MaxStdinChunk); err != nil {
			return nil, err
		}
	}
	if v, ok := p["eof"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &r.EOF); err != nil {
			return nil, invalid("eof is not a boolean")
		}
	}
	if r.Offset > 1<<62 {
		return nil, invalid("offset is out of range")
	}
	return r, nil
}

// ResizeRequest is a parsed resize payload.
type ResizeRequest struct {
	ExecutionID string
	TTYSize
}

// ParseResize validates a resize payload.
func ParseResize(p map[string]json.RawMessage) (*ResizeRequest, error) {
	id, err := (&Message{Payload: p}).ExecutionID()
	if err != nil {
		return nil, err
	}
	sz, err := parseTTY(p)
	if err != nil {
		return nil, err
	}
	return &ResizeRequest{ExecutionID: id, TTYSize: sz}, nil
}

// parseTTY reads rows and cols from an object: each 1-65535.
func parseTTY(p map[string]json.RawMessage) (TTYSize, error) {
	var rows, cols int
	if json.Unmarshal(p["rows"], &rows) != nil || json.Unmarshal(p["cols"], &cols) != nil ||
		rows < 1 || rows > 65535 || cols < 1 || cols > 65535 {
		return TTYSize{}, invalid("rows and cols must be integers in 1-65535")
	}
	return TTYSize{Rows: uint16(rows), Cols: uint16(cols)}, nil
}

// ParseDial validates the headers of a dial: an execution id and a TCP
// port (1-65535, decimal).
func ParseDial(execution, port string) (string, int, error) {
	if !ValidID(execution) {
		return "", 0, invalid("%s is missing or malformed", HeaderDialExecution)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return "", 0, invalid("%s must be a port number in 1-65535", HeaderDialPort)
	}
	return execution, n, nil
}
