package boxrt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The gVisor backend keeps one runsc sandbox warm and runs each command
// in it through the runtime's serve step, the sandbox's init. The host
// and the step speak in frames over the step's stdin (host to sandbox)
// and stdout (sandbox to host): a kind byte, the command's id (uint32,
// big endian), the payload's length (uint32) and the payload. Every
// command's streams share the one pipe; a command's Done frame comes
// after all of its output frames.
const (
	FrameRequest = 'R' // host: a command to start; payload: GVRequest as JSON
	FrameStdin   = 'I' // host: bytes for the command's stdin
	FrameEOF     = 'E' // host: the command's stdin ends
	FrameSignal  = 'S' // host: a signal for the command (payload: one byte)
	FrameKill    = 'K' // host: kill every process of the command
	FrameResize  = 'W' // host: the command's terminal's new size (payload: rows, cols, uint16 big endian each)
	FrameDial    = 'P' // host: connect to a port of the command's loopback (payload: the dial's number, uint32, and the port, uint16)
	FrameStdout  = 'O' // sandbox: the command's stdout
	FrameStderr  = 'e' // sandbox: the command's stderr
	FrameDone    = 'D' // sandbox: the command ended; payload: GVDone as JSON
	FrameHello   = 'H' // sandbox: the serve step is ready; payload: Identity
)

// GVDialSocket is the name, in a command's view directory, of the socket
// the host listens on for the connections FrameDial asks for: the serve
// step connects to 127.0.0.1:PORT in the command's network namespace,
// then to this socket, writes the dial's number (uint32, big endian) and
// a status byte (GVDialOK, or GVDialRefused and nothing more), and relays
// the two connections. The command never sees it: the views are
// unmounted from its namespace.
const GVDialSocket = "dial.sock"

// The dial's status byte.
const (
	GVDialOK      = 0
	GVDialRefused = 1
)

// MaxFrame bounds a frame's payload; a longer one is a broken peer.
const MaxFrame = 1 << 20

// ErrFrame: a frame that breaks the protocol.
var ErrFrame = errors.New("boxrt: malformed frame")

// GVRequest is one command for the serve step. View is the directory,
// under the sandbox's views mount, that holds the command's workspace
// (ws) and its caches (c0, c1, ...), mounted there by the host.
type GVRequest struct {
	View      string    `json:"view"`
	Workspace string    `json:"workspace"`
	Caches    []GVCache `json:"caches,omitempty"`
	Cwd       string    `json:"cwd"`
	Env       []string  `json:"env"`
	Args      []string  `json:"args"`
	FSize     int64     `json:"fsize,omitempty"` // bytes; 0: none
	Stdin     bool      `json:"stdin,omitempty"`
	// Lookup: Args[0] is found in the PATH of Env as sh finds it (127
	// when it is not there); else it is a path run as is.
	Lookup bool `json:"lookup,omitempty"`
	// Egress: the command reaches the network only through the egress
	// proxy, whose socket (and CA bundle) the host mounted in the view.
	Egress *GVEgress `json:"egress,omitempty"`
	// TTY: the command runs on a new terminal of this size, of the
	// command's own devpts instance; its stdin, stdout and stderr are
	// the terminal, whose output comes as FrameStdout.
	TTY *GVTTY `json:"tty,omitempty"`
}

// GVTTY is a terminal's size.
type GVTTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// GVEgress is an allowlist command's proxy: Socket and CA are names under
// the view; the step listens on 127.0.0.1:Port in the command's network
// namespace and relays each connection to the socket, which it also
// mounts at GVEgressSocket (and the CA at GVEgressCA and over the system
// trust store).
type GVEgress struct {
	Socket string `json:"socket"`
	CA     string `json:"ca,omitempty"`
	Port   int    `json:"port"`
	// Forward are the allowlist's loopback targets (127.0.0.1:PORT): the
	// step listens on each and relays to Socket, a socket under the view
	// where the host tunnels to the target through the proxy (clients
	// such as Go's net/http never use a proxy for a loopback address).
	Forward []GVForward `json:"forward,omitempty"`
}

// GVForward is one loopback target and its socket under the view.
type GVForward struct {
	Addr   string `json:"addr"`
	Socket string `json:"socket"`
}

// Where an allowlist command finds the proxy.
const (
	GVEgressDir    = "/run/pulse-egress"
	GVEgressSocket = GVEgressDir + "/proxy.sock"
	GVEgressCA     = GVEgressDir + "/ca.pem"
)

// gvSystemCA are the usual paths of a Linux system's CA bundle
// (backend/internal/cabundle.System, which this package cannot import).
var gvSystemCA = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// GVCache is a cache directory: Src under the view, mounted at Path.
type GVCache struct {
	Src  string `json:"src"`
	Path string `json:"path"`
}

// GVDone is how a command ended. Signal is the signal that ended it (0:
// it exited with Exit); Err says why it could not start.
type GVDone struct {
	Exit    int    `json:"exit"`
	Signal  int    `json:"signal,omitempty"`
	UserNs  int64  `json:"user_ns,omitempty"`
	SysNs   int64  `json:"sys_ns,omitempty"`
	Err     string `json:"err,omitempty"`
	Started bool   `json:"started,omitempty"`
}

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, kind byte, id uint32, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: payload of %d bytes", ErrFrame, len(payload))
	}
	buf := make([]byte, 9+len(payload))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:], id)
	binary.BigEndian.PutUint32(buf[5:], uint32(len(payload)))
	copy(buf[9:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame.
func ReadFrame(r io.Reader) (kind byte, id uint32, payload []byte, err error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[5:])
	if n > MaxFrame {
		return 0, 0, nil, fmt.Errorf("%w: payload of %d bytes", ErrFrame, n)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, nil, err
	}
	return h[0], binary.BigEndian.Uint32(h[1:]), payload, nil
}
