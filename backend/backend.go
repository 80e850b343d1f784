package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/backend/internal/cabundle"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Error classes shared by every backend. Implementations wrap them with %w
// and a message that says what was tried; callers test with errors.Is.
// All but ErrOverlayLost are the classes of package errdefs themselves,
// so that a caller's errors.Is matches whichever layer returned one.
var (
	// ErrUnavailable: the backend cannot run commands on this machine
	// (no engine, no namespaces, server unreachable). Probe wraps it.
	ErrUnavailable = errdefs.ErrUnavailable
	// ErrClosed: the backend was used after Close.
	ErrClosed = errdefs.ErrClosed
	// ErrInvalidRequest: the request is malformed (no command, cwd outside
	// the workspace, bad limits). Nothing was started.
	ErrInvalidRequest = errdefs.ErrInvalidArgument
	// ErrUnsupported: the request asks for something the backend cannot do
	// (for example a network mode it cannot enforce). Nothing was started.
	ErrUnsupported = errdefs.ErrUnsupported
	// ErrOverlayLost: the command ran, but what it wrote could not be
	// captured (its overlay could not be read back, was over a limit, or
	// could not be kept or fetched). It is the one error Exec returns
	// together with a Result: the Result says how the command ended (exit
	// code, termination, output as far as it was delivered) and has no
	// Overlay, and the error, which wraps ErrOverlayLost, says why the
	// writes are gone. A caller must not read that Result as a command
	// that wrote nothing.
	ErrOverlayLost = errors.New("command ran but its writes were lost")
)

// Backend runs one command at a time per Exec call, isolated as far as the
// implementation can. Every method is safe for concurrent use; many Exec
// calls may run at once on one Backend.
type Backend interface {
	// Name is a short stable identifier ("host", "namespace", "docker",
	// "remote") used in audit events and on the command line.
	Name() string

	// Probe reports whether the backend can run commands here. It returns
	// nil when it can, or an error wrapping ErrUnavailable that says why
	// not and, where there is one, how to fix it. Probe has no side
	// effects a user would notice (it may cache what it learns).
	Probe(ctx context.Context) error

	// Capabilities says what the backend enforces. It does not block and
	// does not fail; a backend that has not been probed reports what it
	// would enforce if Probe succeeded.
	Capabilities() Capabilities

	// Exec runs req and waits for it to end. It returns a non-nil Result
	// with a nil error whenever a process was started, whatever its end:
	// non-zero exit, signal, timeout, cancellation of ctx (Termination is
	// Cancelled) or output cap. It returns an error, and no Result, only
	// when nothing could be started: an invalid request (ErrInvalidRequest),
	// an unavailable backend (ErrUnavailable), use after Close (ErrClosed).
	// The one exception: a command that ran but whose writes could not be
	// captured returns its Result (without Overlay) and an error wrapping
	// ErrOverlayLost.
	// When Exec returns, no process it started is still running, and
	// req.Stdin has been read to EOF or abandoned, and is closed if it
	// implements io.Closer.
	Exec(ctx context.Context, req *Request) (*Result, error)

	// Reconcile removes what crashed processes using this backend left
	// behind (containers, mounts, temporary directories). It must not
	// touch what live executions, in this or another process, are using.
	Reconcile(ctx context.Context) error

	// Close releases the backend's resources and ends any execution still
	// running. Close is idempotent: it returns nil when already closed.
	Close() error
}

// Isolation names how far a backend separates a command from the host. It
// is written to the audit log as isolation_level.
type Isolation string

// The isolation levels, as the audit log spells them.
const (
	IsolationHostUnsafe Isolation = "host_unsafe"
	IsolationNamespace  Isolation = "namespace"
	IsolationContainer  Isolation = "container"
	IsolationRemote     Isolation = "remote_container"
	// IsolationGVisor: the command's system calls are served by a
	// user-space kernel (gVisor's runsc), not the host kernel.
	IsolationGVisor Isolation = "gvisor"
)

// Capabilities is what a backend enforces. The facade uses it to refuse,
// before anything starts, a command whose effective policy the backend
// cannot enforce strongly.
type Capabilities struct {
	Isolation Isolation `json:"isolation"`
	// Network is the enforcement level per network mode; a missing mode
	// is Unsupported.
	Network map[policy.NetworkMode]policy.EnforcementLevel `json:"network"`
	// Secrets is the enforcement level per secret mode; a missing mode is
	// Unsupported.
	Secrets map[secrets.Mode]policy.EnforcementLevel `json:"secrets"`
	// CapturesWrites is true when the command sees a read-only workspace
	// and its writes come back as Result.Overlay; false when it writes in
	// place (the host backend).
	CapturesWrites bool `json:"captures_writes"`
	// HidesPaths is true when the backend honours Request.Hidden: the
	// command cannot read the contents of the listed paths. The facade
	// refuses (ErrUnsupportedPolicy) a command with hidden paths on a
	// backend that does not.
	HidesPaths bool `json:"hides_paths,omitempty"`
	// StacksPending is true when the backend honours Request.Pending:
	// the command sees the pending stack over the workspace, and its
	// Overlay is relative to that view.
	StacksPending bool `json:"stacks_pending,omitempty"`
	// MountsCaches is true when the backend honours Request.Caches. The
	// facade refuses (ErrUnsupportedPolicy) a command with caches on a
	// backend that does not, rather than run it without them.
	MountsCaches bool `json:"mounts_caches,omitempty"`
	// Limits is the enforcement level of each resource limit.
	Limits map[policy.LimitKey]policy.EnforcementLevel `json:"limits,omitempty"`
	// Notes are human-readable facts for `pulse doctor` (hardened
	// defaults, what the kernel lacks).
	Notes []string `json:"notes,omitempty"`
}

// NetworkLevel returns the enforcement level of mode (Unsupported when the
// backend does not list it).
func (c Capabilities) NetworkLevel(mode policy.NetworkMode) policy.EnforcementLevel {
	if l, ok := c.Network[mode]; ok {
		return l
	}
	return policy.Unsupported
}

// SecretLevel returns the enforcement level of mode (Unsupported when the
// backend does not list it).
func (c Capabilities) SecretLevel(mode secrets.Mode) policy.EnforcementLevel {
	if l, ok := c.Secrets[mode]; ok {
		return l
	}
	return policy.Unsupported
}

// Request is one command to run.
type Request struct {
	// ExecutionID identifies the execution in audit events and in the
	// backend's own bookkeeping. The facade always sets it.
	ExecutionID string

	// Workspace is the absolute host path of the workspace the command
	// runs against. Capturing backends show it read-only and return the
	// writes as an overlay; the host backend runs in it directly.
	Workspace string

	// Exactly one of Args and Shell is set. Args is an argv run without a
	// shell; Shell is a script run by `bash -c` (or `sh -c` where bash is
	// missing).
	Args  []string
	Shell string

	// Dir is the working directory, relative to Workspace ("" or "." for
	// its root). It must stay inside the workspace.
	Dir string

	// Env is the command's whole environment on top of a minimal base
	// (PATH, HOME, LANG, TERM, USER): nothing from the caller's
	// environment is inherited. Secrets allowed by the policy are put
	// here by the caller.
	Env map[string]string

	// Stdin feeds the command's standard input; nil means empty. It is
	// always closed for the command, so readers see EOF.
	Stdin io.Reader

	// Stdout and Stderr receive output while the command runs, in chunks
	// as it arrives; nil discards. Each is written from one goroutine at a
	// time, never both from the same goroutine concurrently.
	Stdout io.Writer
	Stderr io.Writer

	// Limits bounds the command; zero fields take policy defaults.
	Limits policy.ResourceLimits
	// Network and Secrets are the effective policies, already resolved by
	// the facade. A backend refuses with ErrUnsupported a mode it cannot
	// enforce at all.
	Network policy.NetworkPolicy
	Secrets secrets.Policy

	// Egress is set together with an allowlist Network policy: the proxy
	// outside the sandbox that is the command's only way out. A backend
	// that enforces allowlist bridges it into the sandbox (see Egress);
	// an allowlist request without it is refused with ErrUnsupported.
	Egress *Egress

	// Hidden lists workspace paths the policy forbids the command to
	// read (slash-separated, relative to Workspace, cleaned, never under
	// .pulse), expanded by the facade from the read-deny rules against
	// what exists now. A backend with Capabilities.HidesPaths shows each
	// as absent (or as an empty file or directory) in the command's view
	// of the workspace, never with its real contents; what the command
	// writes there itself is captured as usual.
	Hidden []string

	// Pending is the stack of pending changes the command runs on top
	// of: the workspace as it is on disk now, then each pending
	// transaction in order, and nothing else (see Pending). nil runs the
	// command on the workspace alone. A backend with
	// Capabilities.StacksPending honours it; the facade refuses a
	// non-empty stack on a capturing backend that does not. The host
	// backend writes in place, has no pending stack and ignores it.
	Pending *Pending
	// Lane names the line of pending transactions Pending is the stack
	// of ("" the workspace's default lane; a fork's own otherwise, see
	// cowfs "Lanes"). A backend that keeps a workspace's state from one
	// command to the next (a warm container) keeps it apart per lane, so
	// that commands of two lanes running at once never see each other's
	// writes.
	Lane string

	// Caches are persistent host directories the command sees read-write
	// at their Path, outside the workspace view (see Cache), checked with
	// CheckCaches. Their writes are never captured: they are not in
	// Result.Overlay and not reviewed. A backend with
	// Capabilities.MountsCaches mounts each; one without refuses a
	// request that has any with ErrUnsupported, never runs it without.
	Caches []Cache

	// TTY, when set, runs the command on a new pseudo-terminal made
	// inside the sandbox (never the caller's), of this size: its stdin,
	// stdout and stderr are the terminal, whose output arrives on Stdout
	// and whose input is Stdin. Only a backend that implements
	// TerminalStarter honours it; the facade sends it to no other.
	TTY *TTY

	// StreamFiles lets the backend hand a large regular file of the
	// overlay as File.Source (a host path) instead of File.Data, so that
	// it is never held in memory. The caller must then call
	// Overlay.Release once it has read the files. A backend may ignore
	// it (every file then has Data). Only a caller that reads files
	// through File.Open on this host sets it: an overlay with sources
	// cannot be sent anywhere as it is (see File.Source).
	StreamFiles bool
}

// TerminationReason says why a command ended.
type TerminationReason string

// The termination reasons.
const (
	Exited      TerminationReason = "exited"
	Signaled    TerminationReason = "signaled"
	Timeout     TerminationReason = "timeout"
	Cancelled   TerminationReason = "cancelled"
	OutputLimit TerminationReason = "output_limit"
	OOM         TerminationReason = "oom"
	// DiskLimit: what the command wrote reached its bound
	// (policy.ResourceLimits.DiskBytes, or the backend's default) while
	// it ran; its writes up to the bound are kept.
	DiskLimit TerminationReason = "disk_limit"
)

// Result is how a command ended and what it wrote.
type Result struct {
	// ExitCode is the process's exit status; -1 when it was killed by a
	// signal (including on timeout and cancellation).
	ExitCode    int               `json:"exit_code"`
	Termination TerminationReason `json:"termination_reason"`
	// TimedOut is Termination == Timeout, kept as a field for the wire.
	TimedOut bool `json:"timed_out"`
	// Truncated is true when stdout or stderr went over the output cap and
	// the excess was dropped.
	Truncated bool          `json:"truncated"`
	Duration  time.Duration `json:"duration"`
	// PID is the process id as the backend saw it (in its own namespace
	// for isolating backends); 0 when unknown.
	PID     int     `json:"pid"`
	Metrics Metrics `json:"metrics"`
	// Overlay is what the command wrote to the workspace, when the backend
	// captures writes; nil otherwise.
	Overlay *Overlay `json:"overlay,omitempty"`
	// Network are the connections through the backend's own egress proxy
	// (Egress.Inject), nil when the caller's proxy carried them.
	Network []NetworkEvent `json:"network,omitempty"`
	// NetworkDropped counts the connections left out of Network, which
	// is bounded.
	NetworkDropped int `json:"network_dropped,omitempty"`
}

// Metrics are resource figures of one execution; zero when unknown.
type Metrics struct {
	MaxRSSBytes int64         `json:"max_rss_bytes"`
	UserCPU     time.Duration `json:"user_cpu"`
	SystemCPU   time.Duration `json:"system_cpu"`
	// DiskBytes is the space what the command wrote took when it ended,
	// where the backend bounds it (limits.disk_bytes); 0 when unknown. On
	// namespace it is memory too (see policy.ResourceLimits.DiskBytes).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// Overlay is the set of changes a command made to the workspace, relative
// to what it saw when it started. Paths are slash-separated, relative to
// the workspace root, cleaned, and never under .pulse/.
type Overlay struct {
	// Files are created or changed entries, byte-exact.
	Files []File `json:"files,omitempty"`
	// Deleted are paths that existed and were removed.
	Deleted []string `json:"deleted,omitempty"`

	release func() error
}

// Empty reports whether the overlay holds no change.
func (o *Overlay) Empty() bool { return o == nil || len(o.Files) == 0 && len(o.Deleted) == 0 }

// SetRelease makes fn what Release runs: a backend that hands files as
// File.Source removes them there, and returns an error naming what it
// could not remove.
func (o *Overlay) SetRelease(fn func() error) { o.release = fn }

// Release frees what the overlay's File.Source paths hold: after it,
// those paths are gone, or the error names what is left on the host (the
// caller reports it: a leftover of a command is never silent). It runs
// once; later calls, and calls on an overlay without sources or a nil
// one, do nothing and return nil. An overlay whose caller asked for
// sources (Request.StreamFiles) must be released, on every path, once
// its files are read.
func (o *Overlay) Release() error {
	if o == nil || o.release == nil {
		return nil
	}
	fn := o.release
	o.release = nil
	return fn()
}

// File is one created or changed entry. Mode carries the type bits: a
// regular file has none and Data is its content; a directory has
// fs.ModeDir and no Data; a symlink has fs.ModeSymlink and Data is the
// link target. A regular file may instead have Source set (only when
// the caller asked with Request.StreamFiles): read it with Open or Bytes.
// A named pipe, socket or device node the command left (fs.ModeNamedPipe,
// fs.ModeSocket, fs.ModeDevice) is reported too, with no Data: it is not
// content that can be kept, but leaving it out would say nothing
// changed where the command replaced a file with one, and the caller
// tells the user it was not kept. What it replaced is a deletion; a
// backend that knows what the command was shown there lists it in
// Deleted, and the facade adds it where a backend cannot tell. An entry
// the command wrote that the backend could not carry back (fs.ModeIrregular:
// on Docker, a name holding a newline) is reported the same way, with no
// Data and no deletion, so that it does not vanish from the result.
type File struct {
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode"`
	Data []byte      `json:"data,omitempty"`
	// Source, when set, is the host path of a regular file whose bytes
	// are the content, in place of Data (which is then nil). It stays
	// valid until the overlay's Release; nothing else may write it. It
	// is never encoded (MarshalJSON refuses a file with a Source), so
	// an overlay is read into Data (Overlay.Load) before it leaves the
	// host.
	Source string `json:"-"`
}

// ErrSourceNotLoaded is returned when a File with a Source would be
// encoded: its bytes are on this host only (see File.Source).
var ErrSourceNotLoaded = errors.New("backend: overlay file has a host source; load it first")

// Special reports whether f is a named pipe, socket, device node or an
// entry the backend could not carry back: reported, never content (see
// File).
func (f File) Special() bool {
	return !f.Mode.IsRegular() && !f.Mode.IsDir() && f.Mode&fs.ModeSymlink == 0
}

// MarshalJSON refuses a file whose bytes are in Source, so that they are
// never lost silently on the way to another process.
func (f File) MarshalJSON() ([]byte, error) {
	if f.Source != "" {
		return nil, fmt.Errorf("%w: %s", ErrSourceNotLoaded, f.Path)
	}
	type plain File
	return json.Marshal(plain(f))
}

// Open returns a reader of the file's content: Data, or Source.
func (f *File) Open() (io.ReadCloser, error) {
	if f.Source == "" {
		return io.NopCloser(bytes.NewReader(f.Data)), nil
	}
	fl, err := os.OpenFile(f.Source, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("backend: overlay file %s: %w", f.Path, err)
	}
	return fl, nil
}

// Bytes returns the file's content, reading Source whole when it is set.
func (f *File) Bytes() ([]byte, error) {
	if f.Source == "" {
		return f.Data, nil
	}
	r, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("backend: overlay file %s: %w", f.Path, err)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// Load reads every Source of the overlay into Data, so that the overlay
// stands alone (to encode it, or keep it past Release).
func (o *Overlay) Load() error {
	if o == nil {
		return nil
	}
	for i := range o.Files {
		f := &o.Files[i]
		if f.Source == "" {
			continue
		}
		b, err := f.Bytes()
		if err != nil {
			return err
		}
		f.Data, f.Source = b, ""
	}
	return nil
}

// Egress is a filtering proxy that runs outside the sandbox and listens
// on a unix socket. A backend bridges it into the sandbox's otherwise
// empty network, points the proxy variables at the bridge (ProxyEnv) and
// puts CAFile, when set, where the command's TLS clients look.
type Egress struct {
	// Socket is the host path of the proxy's unix socket.
	Socket string
	// ServeConn, when set, is the same proxy serving one connection in
	// this process (egress.Proxy.ServeConn; it closes the connection). A
	// backend that accepts the sandbox's connections in this process
	// (Docker) hands them to it instead of relaying them to Socket, so
	// their bytes take one relay, not two. Socket stays required.
	ServeConn func(net.Conn) `json:"-"`
	// CAFile is the host path of a PEM bundle the command must trust
	// (the system roots plus the sandbox's own CA), or "".
	CAFile string
	// CA is the sandbox's own CA alone, PEM, set with CAFile: for a
	// backend whose sandbox has roots of its own to add it to.
	CA []byte
	// Inject are the secrets bound to hosts, for a backend whose
	// commands reach the network through a proxy of its own elsewhere
	// (remote: the server's), which must inject them; a backend that
	// uses Socket ignores them (the proxy there holds them already).
	Inject []Injection
}

// Injection is a secret bound to hosts: the command's environment holds
// Placeholder under Name, and the proxy puts Value into the headers of
// requests to Hosts only.
type Injection struct {
	Name        string
	Placeholder string
	Value       string
	Hosts       []string
}

// NetworkEvent is one connection (or plain-HTTP request) through an
// egress proxy the backend ran itself: the facade audits it as it does
// its own proxy's.
type NetworkEvent struct {
	Method string
	Host   string
	Port   int
	// Addr is the address dialled ("" when nothing was).
	Addr    string
	Allowed bool
	// Rule is the allowlist entry that allowed its destination, Reason
	// why it was refused (or failed after being allowed); a refusal with
	// Rule set was for what was sent to an allowed destination (see
	// egress.Event).
	Rule, Reason string
	// Injected names the secrets put into its headers.
	Injected       []string
	Sent, Received int64
	Duration       time.Duration
}

// SystemRoots is this machine's CA bundle (PEM, ending in a newline), or
// nil when it has none: what a sandbox keeps trusting next to its own CA,
// so hosts reached untouched are verified as outside it.
func SystemRoots() []byte {
	// The paths live in one place, shared with the sandbox init (whose
	// build identity hashes them); they are not exported from here, where
	// a caller could change them under the init.
	for _, p := range cabundle.System {
		if b, err := os.ReadFile(p); err == nil {
			return append(b, '\n')
		}
	}
	return nil
}

// ProxyEnv is the environment that points a command at a proxy reachable
// at proxyURL, and at the CA bundle at caPath ("" for none).
func ProxyEnv(proxyURL, caPath string) map[string]string {
	env := map[string]string{}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		env[k] = proxyURL
		env[strings.ToLower(k)] = proxyURL
	}
	// Tools that honour NO_PROXY must not skip the proxy for anything:
	// nothing is reachable without it.
	env["NO_PROXY"], env["no_proxy"] = "", ""
	if caPath != "" {
		for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE", "PIP_CERT"} {
			env[k] = caPath
		}
	}
	return env
}
