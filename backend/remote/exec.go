package remote

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

// idChars are the characters an execution id may not hold.
var idChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// errNotFound is the server saying it has no such execution.
var errNotFound = errors.New("execution not found on the server")

func invalid(format string, args ...any) error {
	return fmt.Errorf("remote: %s: %w", fmt.Sprintf(format, args...), backend.ErrInvalidRequest)
}

// checkRequest validates req and returns its working directory, clean and
// relative to the workspace.
func checkRequest(req *backend.Request) (string, error) {
	if len(req.Caches) > 0 {
		// A cache is a directory on this machine; the server has none.
		return "", fmt.Errorf("remote: caches: %w", backend.ErrUnsupported)
	}
	if err := backend.CheckCommand(req); err != nil {
		return "", fmt.Errorf("remote: %w", err)
	}
	// What the protocol refuses beyond the backend contract: a blank
	// script, a command, environment or timeout over its bounds, a
	// variable name it does not take.
	if strings.TrimSpace(req.Shell) == "" && len(req.Args) == 0 {
		return "", invalid("shell script is empty")
	}
	n := len(req.Shell)
	for _, a := range req.Args {
		n += len(a) + 4
	}
	if n > protocol.MaxCommandLen-4096 {
		return "", invalid("command longer than %d bytes", protocol.MaxCommandLen-4096)
	}
	if !filepath.IsAbs(req.Workspace) {
		return "", invalid("workspace %q is not an absolute path", req.Workspace)
	}
	if fi, err := os.Stat(req.Workspace); err != nil || !fi.IsDir() {
		return "", invalid("workspace %q is not a directory", req.Workspace)
	}
	dir := req.Dir
	if strings.ContainsAny(dir, "\x00\\") || path.IsAbs(dir) {
		return "", invalid("Dir %q must be a relative slash-separated path", dir)
	}
	dir = path.Clean("./" + dir)
	if dir == ".." || strings.HasPrefix(dir, "../") {
		return "", invalid("Dir %q leaves the workspace", req.Dir)
	}
	if pathguard.IsReserved(dir) {
		return "", invalid("Dir %q is reserved", req.Dir)
	}
	if len(req.Env) > protocol.MaxEnvEntries {
		return "", invalid("more than %d environment variables", protocol.MaxEnvEntries)
	}
	for k := range req.Env {
		if !protocol.ValidEnvName(k) {
			return "", invalid("environment variable %q is malformed", k)
		}
	}
	if req.Limits.Timeout > protocol.MaxTimeout {
		return "", invalid("timeout %v not in (0, %v]", req.Limits.Timeout, protocol.MaxTimeout)
	}
	return dir, nil
}

// wireID makes the server-side execution id: the caller's id, reduced to
// the characters the protocol allows, and a random suffix, so that a
// retried or repeated ExecutionID never collides with an earlier one.
func wireID(execID string) string {
	base := strings.Trim(idChars.ReplaceAllString(execID, "-"), ".-_")
	if len(base) > 80 {
		base = base[:80]
	}
	if base == "" {
		base = "x"
	}
	return base + "-" + randhex.String(8)
}

// onceCloser closes req.Stdin exactly once.
type onceCloser struct {
	r    io.Reader
	once sync.Once
}

func (c *onceCloser) close() {
	c.once.Do(func() {
		if cl, ok := c.r.(io.Closer); ok {
			cl.Close()
		}
	})
}

// capWriter caps what reaches one of the caller's writers.
type capWriter struct {
	w         io.Writer
	limit     int64
	n         int64
	truncated bool
	failed    error
}

// write delivers p within the cap and reports whether the cap was hit.
func (c *capWriter) write(p []byte) bool {
	over := false
	if room := c.limit - c.n; int64(len(p)) > room {
		p = p[:max(room, 0)]
		c.truncated, over = true, true
	}
	c.n += int64(len(p))
	if len(p) > 0 && c.w != nil && c.failed == nil {
		if _, err := c.w.Write(p); err != nil {
			// A writer that fails gets no more; the command is not
			// stopped for it, as a local pipe would not stop it either.
			c.failed = err
		}
	}
	return over
}

// run is one execution in flight.
type run struct {
	b        *Backend
	req      *backend.Request
	id       string
	l        *link
	out, err capWriter
	lastSeq  int64
	events   int
	numbered bool
	res      *protocol.Result

	cancelWanted bool
	cancelSent   bool
	capHit       bool
	// stop closes when the caller's context is done or the backend is
	// closed; graceEnd is when a wanted cancellation stops waiting for
	// the server's confirmation (zero until one is wanted).
	stop     <-chan struct{}
	graceEnd time.Time
}

// startGrace starts the wait for a cancellation to be confirmed.
func (x *run) startGrace() {
	if x.graceEnd.IsZero() {
		x.graceEnd = time.Now().Add(x.b.o.cancelWait)
	}
}

// limit shortens deadline to the end of the cancel grace, if one runs.
func (x *run) limit(deadline time.Time) time.Time {
	if !x.graceEnd.IsZero() && x.graceEnd.Before(deadline) {
		return x.graceEnd
	}
	return deadline
}

// Exec implements backend.Backend. The workspace is uploaded, the command
// submitted, its input streamed while it runs (a process submission, when
// the server runs processes; otherwise, and for input already in memory,
// stdin travels whole with the submission), its output streamed to the
// writers as it arrives, and its writes downloaded as the overlay. A dropped
// connection is re-established and the execution reattached from the last
// event seen, so output arrives exactly once. Errors: ErrInvalidRequest,
// ErrUnsupported (a policy mode the server cannot enforce; a workspace or
// stdin over a limit, with ErrTooLarge), ErrUnavailable (with
// ErrUnreachable, ErrUnauthorized, ErrTLS, ErrVersion or ErrCapacity),
// ErrClosed; and, once the command has started, ErrExecutionLost when the
// server lost it or the pulse-worker running it went away (that one with
// ErrUnavailable too), and ErrOverlay with backend.ErrOverlayLost (and the
// Result) when it ran but its writes could not be kept or fetched.
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	return b.exec(ctx, req, nil)
}

// exec is Exec, and with started set the run of a started process
// (process.go): submitted as a process, its input streamed, started
// called once it runs. Its phases: admission (the request, the server's
// capabilities against the effective policies), the input, the
// workspace, the submission, the wait, and the result with its writes.
func (b *Backend) exec(ctx context.Context, req *backend.Request, started func(backend.Control)) (*backend.Result, error) {
	if req == nil {
		return nil, invalid("nil request")
	}
	stdin := &onceCloser{r: req.Stdin}
	defer stdin.close()
	if !b.begin() {
		return nil, fmt.Errorf("remote: %w", backend.ErrClosed)
	}
	defer b.wg.Done()
	dir, err := checkRequest(req)
	if err != nil {
		return nil, err
	}
	netPol, secPol := req.Network, req.Secrets
	if netPol.Mode == "" {
		netPol = policy.DenyAllNetwork()
	}
	if secPol.Mode == "" {
		secPol = secrets.DenyAllSecrets()
	}

	// Nothing has started until submit is acknowledged: the caller's
	// context and Close both abort these steps.
	octx, stop := context.WithCancel(ctx)
	defer stop()
	unhook := context.AfterFunc(b.ctx, stop)
	defer unhook()

	l, err := b.takeLink(octx)
	if err != nil {
		return nil, err
	}
	x := &run{b: b, req: req, id: wireID(req.ExecutionID), l: l, stop: octx.Done()}
	defer func() { x.l.close() }()
	info, err := b.admit(octx, l, netPol, secPol)
	if err != nil {
		return nil, err
	}
	if started == nil && streamsStdin(req, info) {
		// Run as a process so the input streams while the command runs:
		// an input that ends only after the command has printed, or never,
		// cannot travel whole in the submission.
		started = func(backend.Control) {}
	}
	if started != nil {
		if err := checkProcess(req, info); err != nil {
			return nil, err
		}
	}
	var in input
	if req.Stdin != nil && started == nil {
		in, err = b.wholeInput(req.Stdin, info, x.id)
		stdin.close()
		if err != nil {
			return nil, err
		}
	}
	pk, err := b.packWorkspace(req, in.extra, info)
	if err != nil {
		return nil, err
	}
	// A small workspace travels in the submission, to a server that takes
	// it there: one request less. A large one is uploaded first, with its
	// progress reported.
	inline := pk.members > 0 && info.features[protocol.FeatureWorkspace] && len(pk.data) < progressUploadBytes
	if pk.members > 0 && !inline {
		if err := x.uploadWithProgress(octx, pk); err != nil {
			return nil, err
		}
	}
	payload, err := b.submission(req, x.id, dir, netPol, secPol, in, info)
	if err != nil {
		return nil, err
	}
	if inline {
		payload.Workspace = pk.data
	}
	if started != nil {
		payload.Process = true
		if req.TTY != nil {
			payload.TTY = &protocol.TTYSize{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
		}
	}
	lim := req.Limits.WithDefaults()
	x.out = capWriter{w: req.Stdout, limit: lim.OutputBytes}
	x.err = capWriter{w: req.Stderr, limit: lim.OutputBytes}
	if err := x.submit(octx, payload); err != nil {
		return nil, err
	}
	b.log.Debug("remote execution started", "execution_id", x.id)
	if started != nil {
		pc := b.control(x.id, info)
		started(pc)
		go pc.pump(req.Stdin)
		defer pc.stop(stdin.close)
	}
	if err := x.wait(); err != nil {
		return nil, err
	}
	return x.finish(in.fileName)
}

// admit returns what the server said of itself, once the server's
// capabilities (fetched on l when the backend has none yet) enforce the
// effective network and secrets modes; ErrUnsupported otherwise.
func (b *Backend) admit(ctx context.Context, l *link, netPol policy.NetworkPolicy, secPol secrets.Policy) (serverInfo, error) {
	b.mu.Lock()
	caps := b.caps
	b.mu.Unlock()
	if caps == nil {
		c, err := b.fetchCapabilities(ctx, l)
		if err != nil {
			return serverInfo{}, err
		}
		caps = &c
	}
	b.mu.Lock()
	info := b.server
	b.mu.Unlock()
	if caps.NetworkLevel(netPol.Mode) == policy.Unsupported {
		return serverInfo{}, fmt.Errorf("remote: the server cannot enforce network mode %q: %w", netPol.Mode, backend.ErrUnsupported)
	}
	if caps.SecretLevel(secPol.Mode) == policy.Unsupported {
		return serverInfo{}, fmt.Errorf("remote: the server cannot enforce secrets mode %q: %w", secPol.Mode, backend.ErrUnsupported)
	}
	return info, nil
}

// input is a command's standard input sent whole before it starts: in
// the submission (data), or, to a server without the stdin field, as a
// file of the workspace that the command reads and removes (extra,
// named fileName).
type input struct {
	data     []byte
	fileName string
	extra    []extraFile
}

// wholeInput reads r, at most the smaller of this backend's and the
// server's stdin limits, for a submission that carries it whole.
func (b *Backend) wholeInput(r io.Reader, info serverInfo, id string) (input, error) {
	limit := b.o.maxStdin
	if info.features[protocol.FeatureStdin] && info.maxStdin > 0 {
		limit = min(limit, info.maxStdin)
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return input{}, invalid("reading stdin: %v", err)
	}
	if int64(len(data)) > limit {
		return input{}, fmt.Errorf("remote: stdin is longer than %d bytes; the protocol sends it whole before the command starts: %w: %w",
			limit, ErrTooLarge, backend.ErrUnsupported)
	}
	switch {
	case len(data) == 0:
		return input{}, nil
	case info.features[protocol.FeatureStdin]:
		return input{data: data}, nil
	default:
		name := ".pulse-stdin-" + id
		return input{fileName: name, extra: []extraFile{{name: name, data: data}}}, nil
	}
}

// packWorkspace packs the command's view of the workspace (the workspace
// with the pending stack over it, hidden paths left out) and extra.
func (b *Backend) packWorkspace(req *backend.Request, extra []extraFile, info serverInfo) (*packed, error) {
	// A workspace reached through a symlink is packed from its target;
	// the walk would otherwise see one symlink and nothing under it.
	root, err := filepath.EvalSymlinks(req.Workspace)
	if err != nil {
		return nil, invalid("workspace: %v", err)
	}
	var hidden map[string]bool
	for _, h := range req.Hidden {
		if hidden == nil {
			hidden = map[string]bool{}
		}
		hidden[h] = true
	}
	if err := backend.CheckPending(req.Pending); err != nil {
		return nil, err
	}
	pk, err := packView(root, extra, packLimits{compressed: b.o.workspace.MaxCompressed, unpacked: b.o.workspace.MaxUnpacked, members: b.o.workspace.MaxMembers,
		symlinks: info.features[protocol.FeatureSymlinks], hidden: hidden}, req.Pending)
	if err != nil {
		return nil, err
	}
	if len(pk.skipped) > 0 {
		b.log.Warn("workspace entries the server does not accept were left out", "count", len(pk.skipped), "first", pk.skipped[0])
	}
	return pk, nil
}

// uploadWithProgress uploads a packed workspace, telling the progress
// callback about one large enough to take a while.
func (x *run) uploadWithProgress(ctx context.Context, pk *packed) error {
	p := x.b.o.progress
	if p == nil || len(pk.data) < progressUploadBytes {
		return x.upload(ctx, pk.data)
	}
	p(fmt.Sprintf("uploading the workspace (%d entries, %.1f MiB compressed)", pk.members, float64(len(pk.data))/(1<<20)))
	defer p("")
	return x.upload(ctx, pk.data)
}

// submission is the submit payload for req, with what the server
// supports of the additive fields.
func (b *Backend) submission(req *backend.Request, id, dir string, netPol policy.NetworkPolicy, secPol secrets.Policy, in input, info serverInfo) (*protocol.Submit, error) {
	payload := &protocol.Submit{
		ExecutionID: id,
		Command:     command(req, dir, in.fileName),
		Cwd:         dir,
		Encoding:    protocol.EncodingBase64,
		Network:     &netPol,
		Secrets:     &secPol,
		Env:         req.Env,
		Stdin:       in.data,
		TimeoutS:    max(req.Limits.Timeout.Seconds(), 0),
	}
	if req.ExecutionID != "" && len(req.ExecutionID) <= protocol.MaxCorrelation && utf8.ValidString(req.ExecutionID) {
		payload.CorrelationID = req.ExecutionID
	}
	if info.features[protocol.FeatureResultOutput] {
		payload.ResultOutput = protocol.ResultOutputOmit
	}
	if info.features[protocol.FeatureLimits] {
		payload.Limits = wireLimits(req.Limits)
	}
	var err error
	if payload.Inject, err = b.wireInject(req, netPol, info.features); err != nil { // inject.go
		return nil, err
	}
	return payload, nil
}

// finish turns the execution's terminal frame into the Result, with the
// writes it downloaded (less the input file stdinName, when there is
// one). An execution that ran but whose writes could not be fetched
// returns the Result too, with an error wrapping ErrOverlayLost.
func (x *run) finish(stdinName string) (*backend.Result, error) {
	res, err := x.result()
	if err != nil {
		return res, err // a Result too when only the writes were lost
	}
	ov := &backend.Overlay{}
	if x.res.Artifact {
		if ov, err = x.download(); err != nil {
			return res, fmt.Errorf("remote: execution %s ran (exit %d) but what it wrote could not be fetched: %w: %w",
				x.id, res.ExitCode, err, backend.ErrOverlayLost)
		}
	}
	res.Overlay = withoutPath(ov, stdinName)
	return res, nil
}

// streamsStdin reports whether Exec sends req's input as it is read (a
// process submission, when the server runs processes) rather than whole
// with the submission. Input already in memory goes whole: it cannot be
// waiting on the command, and the submission carries it without another
// request.
func streamsStdin(req *backend.Request, info serverInfo) bool {
	if req.Stdin == nil || req.TTY != nil || !info.features[protocol.FeatureProcess] {
		return false
	}
	switch req.Stdin.(type) {
	case *bytes.Reader, *strings.Reader, *bytes.Buffer:
		return false
	}
	return !emptyInput(req.Stdin)
}

// emptyInput says whether r is known to hold nothing: the null device
// (a CLI run with </dev/null, as scripts and CI run it). Its input goes
// whole, as none, instead of on a connection of its own.
func emptyInput(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err == nil && os.SameFile(st, null)
}

// wireLimits is the submit's limits field: the limits set (positive),
// nil when none is. The timeout travels as timeout_s.
func wireLimits(l policy.ResourceLimits) *policy.ResourceLimits {
	w := policy.ResourceLimits{
		MemoryBytes: max(l.MemoryBytes, 0), CPUs: max(l.CPUs, 0), Pids: max(l.Pids, 0),
		FileSizeBytes: max(l.FileSizeBytes, 0), OutputBytes: max(l.OutputBytes, 0),
		DiskBytes: max(l.DiskBytes, 0),
	}
	if w == (policy.ResourceLimits{}) {
		return nil
	}
	return &w
}

// command is the submitted command. With stdin, the command first takes
// its input from the uploaded stdin file and removes it, so that what it
// sees is its input on fd 0 and the workspace as it was.
func command(req *backend.Request, dir, stdinName string) protocol.Command {
	if stdinName == "" {
		if req.Shell != "" {
			return protocol.Command{Shell: req.Shell}
		}
		return protocol.Command{Args: req.Args}
	}
	rel := stdinName
	if dir != "." {
		rel = strings.Repeat("../", strings.Count(dir, "/")+1) + stdinName
	}
	if req.Shell != "" {
		// One line, so the script's own line numbers stay as written.
		return protocol.Command{Shell: "exec 0<'" + rel + "' && rm -f -- '" + rel + "' || exit 126; " + req.Shell}
	}
	return protocol.Command{Args: append([]string{"sh", "-c", `exec 0<"$0" && rm -f -- "$0" || exit 126; exec "$@"`, rel}, req.Args...)}
}

// withoutPath drops the stdin file from an overlay.
func withoutPath(ov *backend.Overlay, name string) *backend.Overlay {
	if name == "" || ov == nil {
		return ov
	}
	out := &backend.Overlay{}
	for _, f := range ov.Files {
		if f.Path != name {
			out.Files = append(out.Files, f)
		}
	}
	for _, d := range ov.Deleted {
		if d != name {
			out.Deleted = append(out.Deleted, d)
		}
	}
	return out
}

// progressUploadBytes is the size from which an upload is reported to
// WithProgress: smaller ones take too little time to be worth a line.
const progressUploadBytes = 1 << 20

// upload sends the workspace. A connection lost on the way is replaced
// and the upload sent again under a new id, since the server refuses a
// second upload to an id whose first may have landed; the orphan is
// removed by the server's reconcile.
func (x *run) upload(ctx context.Context, data []byte) error {
	deadline := time.Now().Add(x.b.o.reconnect)
	for n := 0; ; n++ {
		r, err := x.l.call(ctx, protocol.ActionUpload, &protocol.Upload{ExecutionID: x.id, Data: data}, nil)
		if err == nil {
			if r.isErr || r.Status != protocol.StatusUploaded {
				return refusedUpload(r)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("remote: upload: %w", ctx.Err())
		}
		x.b.log.Info("connection lost during upload, retrying", "execution_id", x.id, "err", err)
		x.l.close()
		if err := x.redial(ctx, n, deadline, err); err != nil {
			return err
		}
		x.id = wireID(x.req.ExecutionID)
	}
}

// refusedUpload is the error of a workspace the server refused.
func refusedUpload(r *reply) error {
	return fmt.Errorf("remote: the server refused the workspace upload (%s %s): it is over the server's limits or holds an entry it does not accept: %w",
		r.Code, r.Message, backend.ErrUnsupported)
}

// redial replaces the connection, waiting backoff(n) first. A
// cancellation asked for meanwhile (x.stop) is remembered and shortens
// the deadline to the cancel grace.
func (x *run) redial(ctx context.Context, n int, deadline time.Time, cause error) error {
	for ; ; n++ {
		wait := backoff(n)
		deadline = x.limit(deadline)
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("remote: connection to %s lost and not re-established in time: %v: %w: %w",
				x.b.u.Redacted(), cause, ErrUnreachable, backend.ErrUnavailable)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("remote: %w", ctx.Err())
		case <-x.stop:
			x.stop = nil
			x.cancelWanted = true
			x.startGrace()
			n--
			continue
		}
		dctx, cancel := context.WithDeadline(ctx, deadline)
		l, err := x.b.dial(dctx)
		cancel()
		if err == nil {
			x.l = l
			return nil
		}
		if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrTLS) {
			return err
		}
		cause = err
	}
}

// submit starts the execution. If the connection drops before the server
// acknowledges, attach tells whether the submission landed: if it did,
// the execution carries on; if not, it is submitted again under the same
// id, so that a first submission the server registers late makes the
// second a duplicate, which is followed, never a second run.
func (x *run) submit(ctx context.Context, payload *protocol.Submit) error {
	resent, renamed := false, false
	for {
		r, err := x.l.call(ctx, protocol.ActionSubmit, payload, x.onFrame)
		if err == nil && resent && r.isErr {
			switch {
			case r.Code == protocol.CodeDuplicate:
				// The first submission landed after all: the server
				// registered it after the attach looked. It is the one
				// that runs; follow it.
				if err := x.reconnect(time.Now().Add(x.b.o.reconnect)); err != nil {
					if errors.Is(err, errNotFound) {
						return fmt.Errorf("remote: the server refused execution %s as a duplicate but does not know it: %w", x.id, ErrProtocol)
					}
					return err
				}
				return nil
			case r.Code == protocol.CodeUpload && payload.Workspace != nil && !renamed:
				// The first submission's workspace is there without
				// its record (it failed, or the server restarted,
				// between the two; the id's lock on the server orders
				// them): that submission will not run, so this one
				// goes again, once, under a new id, which never meets
				// the leftover.
				renamed = true
				x.id = wireID(x.req.ExecutionID)
				payload.ExecutionID = x.id
				continue
			}
		}
		if err == nil {
			return x.submitted(r)
		}
		if errors.Is(err, ErrProtocol) {
			return err
		}
		x.b.log.Info("connection lost during submit, checking whether it landed", "execution_id", x.id, "err", err)
		// The command may be running now: from here on, only the
		// server's word ends it.
		if err := x.reconnect(time.Now().Add(x.b.o.reconnect)); err != nil {
			if errors.Is(err, errNotFound) {
				if ctx.Err() != nil {
					return fmt.Errorf("remote: submit: %w", ctx.Err())
				}
				// Sent again under the same id: the first may still
				// land (the attach can look before the server has
				// registered it), and the server then refuses this
				// one as a duplicate instead of running the command
				// twice.
				resent = true
				continue
			}
			return err
		}
		return nil
	}
}

// submitted maps the server's answer to a submission.
func (x *run) submitted(r *reply) error {
	if !r.isErr && r.Status == protocol.StatusStarting {
		return nil
	}
	switch {
	case r.Code == protocol.CodeCapacity || r.Message == protocol.MsgCapacity:
		return fmt.Errorf("remote: %s: %w: %w", r.Message, ErrCapacity, backend.ErrUnavailable)
	case r.Code == protocol.CodeUnsupported:
		return fmt.Errorf("remote: %s: %w", r.Message, backend.ErrUnsupported)
	case r.Code == protocol.CodeUpload:
		// Only a submission that carried the workspace is answered so.
		return refusedUpload(r)
	case r.Code == protocol.CodeInvalid || r.Code == "":
		return fmt.Errorf("remote: the server refused the submission as invalid (%s): %w", r.Message, backend.ErrInvalidRequest)
	case r.Code == protocol.CodeInternal:
		return fmt.Errorf("remote: the server failed to start the command (%s): %w", r.Message, backend.ErrUnavailable)
	}
	return fmt.Errorf("remote: submit answered %s %q %q: %w", r.Status, r.Code, r.Message, ErrProtocol)
}

// onFrame handles a frame that is not the reply awaited: output events
// and the result.
func (x *run) onFrame(f *protocol.Frame) error {
	switch {
	case f.Stream != nil:
		s := f.Stream
		if s.ExecutionID != x.id {
			return nil
		}
		if s.Seq > 0 {
			x.numbered = true
			if s.Seq <= x.lastSeq {
				return nil // already delivered before a reconnect
			}
			if s.Seq != x.lastSeq+1 {
				x.b.log.Error("output events missing", "execution_id", x.id, "after", x.lastSeq, "got", s.Seq)
			}
			x.lastSeq = s.Seq
		}
		x.events++
		w := &x.out
		if s.Stream == "stderr" {
			w = &x.err
		}
		if w.write(s.Bytes) && !x.capHit {
			x.capHit = true
			x.wantCancel()
		}
	case f.Result != nil:
		if f.Result.ExecutionID == x.id || f.Result.ExecutionID == "" {
			x.res = f.Result
		}
	}
	return nil
}

// wantCancel asks the server to end the command, now if the connection is
// up, else as soon as it is back.
func (x *run) wantCancel() {
	x.cancelWanted = true
	if x.cancelSent {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := x.l.send(ctx, protocol.ActionCancel, &protocol.ExecutionRef{ExecutionID: x.id}); err == nil {
		x.cancelSent = true
	}
}

// wait reads output until the result arrives, reconnecting as needed. The
// caller's context and Close cancel the command; the server's result then
// says how it ended. If the server does not confirm within the cancel
// wait, wait gives up with a synthetic result.
func (x *run) wait() error {
	stop := x.stop
	var grace <-chan time.Time
	for x.res == nil {
		if x.capHit {
			x.startGrace()
		}
		if grace == nil && !x.graceEnd.IsZero() {
			grace = time.After(time.Until(x.graceEnd))
		}
		select {
		case data, ok := <-x.l.frames:
			if !ok {
				x.b.log.Info("connection lost, reattaching", "execution_id", x.id, "last_seq", x.lastSeq, "err", x.l.closedErr())
				if x.events > 0 && !x.numbered {
					return fmt.Errorf("remote: connection lost and the server does not number its output events, so it cannot be resumed exactly: %w: %w", ErrVersion, backend.ErrUnavailable)
				}
				if err := x.reconnect(x.limit(time.Now().Add(x.b.o.reconnect))); err != nil {
					if errors.Is(err, errNotFound) {
						return fmt.Errorf("remote: the server has no record of execution %s (its store was reset or the record expired): %w", x.id, ErrExecutionLost)
					}
					if !x.graceEnd.IsZero() && errors.Is(err, ErrUnreachable) {
						x.giveUp()
						return nil
					}
					return err
				}
				continue
			}
			f, err := decodeFrame(data)
			if err != nil {
				x.wantCancel()
				return fmt.Errorf("remote: %w: %w", ErrProtocol, err)
			}
			if !x.l.answered(f) {
				x.onFrame(f)
			}
		case <-stop:
			stop = nil
			x.wantCancel()
			x.startGrace()
		case <-grace:
			x.giveUp()
		}
	}
	return nil
}

// giveUp ends a cancelled execution whose end the server did not confirm.
func (x *run) giveUp() {
	x.b.log.Error("the server did not confirm the cancellation; the command may still be running there", "execution_id", x.id)
	reason := backend.Cancelled
	if x.capHit {
		reason = backend.OutputLimit
	}
	x.res = &protocol.Result{ExecutionID: x.id, ExitCode: -1, TerminationReason: string(reason), Error: protocol.StatusCancelled}
}

// reconnect replaces a lost connection and reattaches from the last event
// seen, until deadline. It returns errNotFound when the server does not
// know the execution, and an ErrExecutionLost error when the server lost
// it in a restart.
func (x *run) reconnect(deadline time.Time) error {
	x.l.close()
	var cause error = errors.New("connection closed")
	for n := 0; ; n++ {
		if err := x.redial(context.Background(), n, deadline, cause); err != nil {
			return err
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		r, err := x.l.call(ctx, protocol.ActionAttach, &protocol.Attach{ExecutionID: x.id, AfterSeq: x.lastSeq}, x.onFrame)
		cancel()
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				return err
			}
			cause = err
			x.l.close()
			continue
		}
		switch {
		case r.isErr && (r.Code == protocol.CodeAttached || r.Message == protocol.MsgAttached):
			// The server has not yet noticed that the old connection
			// died; it lets go of it shortly.
			cause = errors.New(r.Message)
			x.l.close()
			continue
		case r.isErr && (r.Code == protocol.CodeNotFound || r.Message == protocol.MsgNotFound):
			return errNotFound
		case r.isErr:
			return fmt.Errorf("remote: attach answered %q %q: %w", r.Code, r.Message, ErrProtocol)
		case r.Status == protocol.StatusUnknown:
			return fmt.Errorf("remote: the server restarted while execution %s ran and does not know how it ended (status UNKNOWN): %w", x.id, ErrExecutionLost)
		case r.Status == protocol.StatusNotFound:
			return errNotFound
		case r.Status == protocol.StatusRunning:
			// Ending as attach looked: ask again.
			cause = errors.New("the server reports the execution running but does not stream it")
			x.l.close()
			continue
		}
		x.b.log.Info("reattached", "execution_id", x.id, "status", r.Status, "last_seq", x.lastSeq)
		if x.cancelWanted {
			x.cancelSent = false
			x.wantCancel()
		}
		return nil
	}
}

// result maps the server's result to a backend.Result.
func (x *run) result() (*backend.Result, error) {
	p := x.res
	if p.TerminationReason == "error" {
		msg := p.Stderr
		if d, err := base64.StdEncoding.DecodeString(msg); err == nil && p.Encoding == "base64" {
			msg = string(d)
		}
		if p.ErrorCode == protocol.CodeWorkerLost {
			// It started: the worker running it went away (killed, its
			// node lost). Nothing says how far it got.
			return nil, fmt.Errorf("remote: execution %s was lost with the worker running it: %s: %w: %w",
				x.id, msg, ErrExecutionLost, protocol.ErrorOf(p.ErrorCode))
		}
		return nil, fmt.Errorf("remote: the server could not start the command: %s: %w", msg, protocol.ErrorOf(p.ErrorCode))
	}
	res := &backend.Result{
		ExitCode:    p.ExitCode,
		Termination: backend.TerminationReason(p.TerminationReason),
		TimedOut:    p.TimedOut,
		Truncated:   p.Truncated || x.out.truncated || x.err.truncated,
		Duration:    time.Duration(p.DurationMS) * time.Millisecond,
		Metrics: backend.Metrics{
			MaxRSSBytes: p.Metrics.MaxRSSBytes,
			UserCPU:     time.Duration(p.Metrics.UserCPUMS) * time.Millisecond,
			SystemCPU:   time.Duration(p.Metrics.SystemCPUMS) * time.Millisecond,
		},
	}
	if p.PID != nil {
		res.PID = *p.PID
	}
	res.Network, res.NetworkDropped = protocol.BackendNetwork(p.Network), p.NetworkDropped
	cancelled := p.Error == protocol.StatusCancelled || res.Termination == backend.Cancelled
	switch {
	case x.capHit && cancelled:
		res.Termination, res.ExitCode, res.Truncated = backend.OutputLimit, -1, true
	case cancelled:
		res.Termination = backend.Cancelled
		if res.ExitCode >= 0 && p.TerminationReason != string(backend.Exited) {
			res.ExitCode = -1
		}
	case res.Termination == "":
		res.Termination = backend.Exited
	}
	res.TimedOut = res.Termination == backend.Timeout
	if p.Error == protocol.ResultOverlayLost || p.ErrorCode == protocol.CodeOverlayLost {
		// The command ran, but the server lost what it wrote: the result
		// stands, and the error says the writes are gone.
		return res, fmt.Errorf("remote: execution %s ran (exit %d) but the server could not keep what it wrote: %w: %w",
			x.id, p.ExitCode, ErrOverlay, backend.ErrOverlayLost)
	}
	return res, nil
}

// download fetches the overlay, reconnecting when the connection drops
// (the download is idempotent).
func (x *run) download() (*backend.Overlay, error) {
	deadline := time.Now().Add(x.b.o.reconnect)
	for n := 0; ; n++ {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		r, err := x.l.call(ctx, protocol.ActionDownload, &protocol.ExecutionRef{ExecutionID: x.id}, nil)
		cancel()
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				return nil, fmt.Errorf("remote: download: %w: %w", ErrOverlay, err)
			}
			x.l.close()
			if err := x.redial(context.Background(), n, deadline, err); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrOverlay, err)
			}
			continue
		}
		switch {
		case !r.isErr && r.Status == protocol.StatusNoArtifact:
			return &backend.Overlay{}, nil
		case !r.isErr && r.Status == protocol.StatusDownloaded:
			data, err := base64.StdEncoding.DecodeString(r.Data)
			if err != nil {
				return nil, fmt.Errorf("remote: overlay is not base64: %w", ErrOverlay)
			}
			ov, err := protocol.UnpackOverlay(data, protocol.OverlayLimits{Bytes: x.b.o.maxOverlay, Members: 1_000_000})
			if err != nil {
				return nil, fmt.Errorf("remote: %w: %w", err, ErrOverlay)
			}
			return ov, nil
		}
		return nil, fmt.Errorf("remote: download answered %q %q %q: %w", r.Status, r.Code, r.Message, ErrOverlay)
	}
}
