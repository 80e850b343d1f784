package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// wrapperCmd runs one command: the in-box runtime's exec step
// (internal/boxrt, exec_linux.go), followed by the step's arguments.
var wrapperCmd = []string{runtimePath, "exec"}

// wrapperUser is who the wrapper's exec runs as: root in the container,
// with only wrapperCaps; it drops to the command's own uid.
const wrapperUser = "0:0"

// killGrace is how long Exec waits for a killed command's exec to end
// (a variable so that a test can stand for an engine slower than that).
var killGrace = 30 * time.Second

// maxOverlayBytes bounds what one command's overlay may hold in memory
// when FileSizeBytes does not bound it more tightly.
// (a variable so that a test can make a small write go over it).
var maxOverlayBytes = 1 << 30

// Exec implements backend.Backend.
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	return b.exec(ctx, req, nil)
}

// exec is Exec; onStart, when set, is called with the container and the
// command's id once its exec is started (Start uses it; process.go).
func (b *Backend) exec(ctx context.Context, req *backend.Request, onStart func(containerID, id string)) (*backend.Result, error) {
	if err := validate(req); err != nil {
		closeStdin(req)
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		closeStdin(req)
		return nil, backend.ErrClosed
	}
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()
	defer closeStdin(req)

	mode := req.Network.Mode
	if mode == "" {
		mode = policy.NetworkDenyAll // fail closed: unset means no network
	}
	ws := filepath.Clean(req.Workspace)
	cacheKey, err := checkCaches(req) // caches.go
	if err != nil {
		return nil, err
	}
	// The workspace is walked while the container is made ready.
	walk := startDesired(ws, req)
	defer walk.wait() // on every return: the walk never outlives Exec
	bx, err := b.box(ctx, boxKey{workspace: ws, network: mode, hidden: hiddenKey(req.Hidden), caches: cacheKey, lane: req.Lane})
	if err != nil {
		if errors.Is(err, backend.ErrClosed) || errors.Is(err, backend.ErrUnavailable) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("docker: cancelled while preparing the sandbox container: %w", err)
		}
		return nil, fmt.Errorf("docker: preparing the sandbox container: %v: %w", err, backend.ErrUnavailable)
	}
	req, stop, err := b.bridgeEgress(ctx, bx, req) // egress.go
	if err != nil {
		return nil, err
	}
	defer stop()
	seq, err := b.syncBase(ctx, bx, ws, req, walk)
	if err != nil {
		b.retire(bx)
		return nil, err
	}
	res, m, err := b.run(ctx, bx, req, onStart)
	var ov *backend.Overlay
	if res != nil {
		ov = res.Overlay
	}
	b.finishSync(bx, seq, ov, m)
	b.retire(bx)
	return res, err
}

func validate(req *backend.Request) error {
	if err := backend.CheckCommand(req); err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	if !filepath.IsAbs(req.Workspace) {
		return fmt.Errorf("docker: workspace %q is not an absolute path: %w", req.Workspace, backend.ErrInvalidRequest)
	}
	if st, err := os.Stat(req.Workspace); err != nil || !st.IsDir() {
		return fmt.Errorf("docker: workspace %q is not a directory: %w", req.Workspace, backend.ErrInvalidRequest)
	}
	if _, err := containerDir(req.Dir); err != nil {
		return err
	}
	switch req.Network.Mode {
	case "", policy.NetworkDenyAll, policy.NetworkAllowAll:
	case policy.NetworkAllowlist:
		if req.Egress == nil || req.Egress.Socket == "" {
			return fmt.Errorf("docker: network allowlist needs the egress proxy (Request.Egress): %w", backend.ErrUnsupported)
		}
		if !egressCapable() {
			return fmt.Errorf("docker: network allowlist needs root to bridge the egress proxy into the container: %w", backend.ErrUnsupported)
		}
	default:
		return fmt.Errorf("docker: unknown network mode %q: %w", req.Network.Mode, backend.ErrInvalidRequest)
	}
	for _, h := range req.Hidden {
		if !pathguard.IsWorkspacePath(h) || strings.IndexByte(h, '\\') >= 0 {
			return fmt.Errorf("docker: hidden path %q is not a clean workspace path outside .pulse: %w", h, backend.ErrInvalidRequest)
		}
	}
	return nil
}

// hiddenKey is the boxKey form of a request's hidden paths.
func hiddenKey(hidden []string) string {
	if len(hidden) == 0 {
		return ""
	}
	h := append([]string(nil), hidden...)
	sort.Strings(h)
	return strings.Join(h, "\x00")
}

// containerDir checks that dir stays inside the workspace and returns it
// relative to the workspace root ("." for the root).
func containerDir(dir string) (string, error) {
	if dir == "" {
		return ".", nil
	}
	if filepath.IsAbs(dir) || strings.IndexByte(dir, 0) >= 0 {
		return "", fmt.Errorf("docker: dir %q must be relative to the workspace: %w", dir, backend.ErrInvalidRequest)
	}
	c := path.Clean(filepath.ToSlash(dir))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("docker: dir %q leaves the workspace: %w", dir, backend.ErrInvalidRequest)
	}
	return c, nil
}

func closeStdin(req *backend.Request) {
	if req == nil {
		return
	}
	if c, ok := req.Stdin.(io.Closer); ok {
		_ = c.Close()
	}
}

// buildEnv is the command's whole environment: the minimal base, then
// req.Env; nothing of this process's environment.
func buildEnv(env map[string]string) []string {
	return backend.Environ(map[string]string{
		"PATH": basePath,
		"HOME": "/tmp",
		"LANG": "C.UTF-8",
		"TERM": "dumb",
		"USER": sandboxUser,
	}, env)
}

// maxPooledArgs bounds the request a pooled exec takes (it travels as one
// line, and the loop step holds it whole); larger ones get their own.
const maxPooledArgs = 16 << 10

// commandArgs is the wrapper's argument list after the script name: ID
// DIR FSIZE NONCE, the environment, then the argv to run.
func commandArgs(req *backend.Request, id, nonce string, limits policy.ResourceLimits, sh string) []string {
	dir, _ := containerDir(req.Dir)
	var fsize int64
	if limits.FileSizeBytes > 0 {
		fsize = (limits.FileSizeBytes + 511) / 512
	}
	args := []string{id, dir, strconv.FormatInt(fsize, 10), nonce}
	args = append(args, buildEnv(req.Env)...)
	if req.Shell != "" {
		// bash where the image has it, as the contract says, else sh.
		return append(args, shellDispatch(sh, req.Shell)...) // tools.go
	}
	return append(args, req.Args...)
}

func poolable(req *backend.Request, args []string) bool {
	if req.Stdin != nil || req.TTY != nil {
		return false
	}
	n := 0
	for _, a := range args {
		if a == "" {
			return false // an empty argument: an exec of its own, as always
		}
		n += len(a) + 1
	}
	return n <= maxPooledArgs
}

// run runs the command in bx and says what is known of what its wrapper
// merged into base.
func (b *Backend) run(ctx context.Context, bx *box, req *backend.Request, onStart func(containerID, id string)) (*backend.Result, merged, error) {
	limits := req.Limits.WithDefaults()
	id, nonce := randomID(), randomID()
	args := commandArgs(req, id, nonce, limits, b.shell())

	var (
		reasonMu sync.Mutex
		reason   backend.TerminationReason
		killOnce sync.Once
		killed   = make(chan struct{})
	)
	kill := func(r backend.TerminationReason) {
		reasonMu.Lock()
		if reason == "" {
			reason = r
		}
		reasonMu.Unlock()
		killOnce.Do(func() {
			close(killed)
			go b.killGroup(bx.id, id)
		})
	}
	stdout := &capWriter{w: req.Stdout, limit: limits.OutputBytes, over: func() { kill(backend.OutputLimit) }}
	stderr := &capWriter{w: req.Stderr, limit: limits.OutputBytes, over: func() { kill(backend.OutputLimit) }}
	j := newJob(nonce, stdout, stderr)
	j.killed = killed

	start := time.Now()
	var (
		w       *worker
		abandon func()
		inspect func() (int, bool)
	)
	if req.TTY == nil && bx.takeChan() {
		var err error
		abandon, err = b.startChan(bx, j, req.Stdin, args) // channel.go
		if err != nil {
			// Not started, and it will not be: an exec runs it.
			b.log.Debug("request channel not taken; running an exec", "container", bx.id, "err", err)
			abandon = nil
			bx.putChan()
		} else {
			defer bx.putChan()
		}
	}
	if abandon == nil && poolable(req, args) {
		if w = b.startPooled(bx, j, args); w != nil {
			abandon = func() { w.close() }
		}
	}
	if abandon == nil {
		var err error
		abandon, inspect, err = b.startFresh(bx, j, req, args)
		if err != nil {
			return nil, mergedKnown, err
		}
	}
	if onStart != nil {
		onStart(bx.id, id)
	}

	timer := time.NewTimer(limits.Timeout)
	defer timer.Stop()
	closeCh := b.closeCh
	done := ctx.Done()
	var grace <-chan time.Time
wait:
	for {
		select {
		case <-j.done:
			break wait
		case <-timer.C:
			kill(backend.Timeout)
		case <-done:
			kill(backend.Cancelled)
			done = nil
		case <-closeCh:
			kill(backend.Cancelled)
			closeCh = nil
		case <-killed:
			killed = nil
			// If the kill exec cannot reach the group (the engine is
			// stuck), stop waiting rather than hang the caller forever.
			grace = time.After(killGrace)
		case <-grace:
			b.log.Error("command did not end after its process group was killed; abandoning its exec", "container", bx.id)
			abandon()
			grace = nil
		}
	}
	dur := time.Since(start)
	if w != nil {
		bx.putWorker(w)
	}

	res := &backend.Result{ExitCode: -1, Termination: backend.Exited, Duration: dur}
	res.Truncated = stdout.truncated() || stderr.truncated()
	// Whether the kernel's OOM killer ended a process of the container
	// while the command ran: asked of the engine's events only for a
	// command killed by SIGKILL or a wrapper that did not report.
	// (Not for one this backend killed: that is its reason.) The engine
	// records the event a moment after the kill, so the events up to a
	// second from now are read, which that second costs.
	oom := func() bool {
		reasonMu.Lock()
		ours := reason != ""
		reasonMu.Unlock()
		return !ours && b.oomSince(bx.id, start)
	}
	m, lost, err := readOutcome(req, j, inspect, res, b.diskLimitNote(), oom, b.memoryLimitNote())
	if err != nil {
		return nil, m, err
	}
	reasonMu.Lock()
	r := reason
	reasonMu.Unlock()
	if r != "" {
		res.Termination = r
		res.ExitCode = -1
		res.TimedOut = r == backend.Timeout
	}
	return res, m, lost
}

// readOutcome reads the wrapper's report of a finished command into res
// (exit status, overlay, process group, metrics) and says what is known
// of what it merged into base. scratch says how the container's scratch
// got its size (diskLimitNote), named when the command filled it. lost
// wraps ErrOverlayLost when the command
// ran but what it wrote cannot be read back (res keeps what the report or
// inspect says of its exit); err is a request the wrapper refused.
func readOutcome(req *backend.Request, j *job, inspect func() (int, bool), res *backend.Result, scratch string, oom func() bool, memory string) (m merged, lost, err error) {
	var oc *outcome
	var readErr error
	m = mergedKnown
	switch {
	case !j.out.complete():
		// The wrapper may not have ended: it may merge into base later.
		m = mergedUnsettled
		readErr = errors.New("the exec wrapper ended without reporting (was the container removed?)")
		if oom() {
			res.Termination = backend.OOM
			readErr = fmt.Errorf("the container ran out of memory (%s) and the exec wrapper was killed with the command; raise limits.memory_bytes in the policy", memory)
		}
	case j.out.overflow:
		m = mergedUnknown
		readErr = fmt.Errorf("%w: the changes exceed %d bytes", ErrBadOverlay, maxOverlayBytes)
	default:
		oc, readErr = parseReport(j.out.report(), int64(maxOverlayBytes))
		if readErr != nil {
			m = mergedUnknown
		}
	}
	if readErr != nil {
		// The command ran; what it wrote cannot be read back. Say so on
		// its stderr rather than return a partial overlay.
		fmt.Fprintf(stderrOrDiscard(req), "pulse: docker: reading the command's changes failed: %v\n", readErr)
		lost = fmt.Errorf("docker: the command ran but reading what it changed failed: %w: %w", readErr, backend.ErrOverlayLost)
		if oc != nil && strings.HasPrefix(oc.status, "exit ") {
			// The report was read but for the changes: its status stands.
			if code, err := strconv.Atoi(strings.TrimPrefix(oc.status, "exit ")); err == nil {
				res.ExitCode = code
			}
		} else if inspect != nil {
			if code, ok := inspect(); ok {
				res.ExitCode = code
			}
		}
	} else {
		res.Overlay = oc.overlay
		res.PID = oc.pgid
		res.Metrics = oc.metrics
		switch {
		case oc.status == "nodir":
			return m, nil, fmt.Errorf("docker: working directory %q does not exist in the workspace: %w", req.Dir, backend.ErrInvalidRequest)
		case oc.status == "copy":
			// The working copy could not be made: nothing ran.
			why := ""
			if oc.warn != "" {
				why = ": " + oc.warn
			}
			return m, nil, fmt.Errorf("docker: the command's working copy could not be made%s: %w", why, backend.ErrUnavailable)
		case strings.HasPrefix(oc.status, "exit "):
			if code, err := strconv.Atoi(strings.TrimPrefix(oc.status, "exit ")); err == nil {
				res.ExitCode = code
			}
		default:
			// The wrapper stopped after the command ran, before it could
			// list what the command changed ("manifest N": a name it
			// cannot track, a listing that failed; N is the command's exit
			// status): whatever the report holds is not all the command
			// wrote, so none of it is handed on as if it were.
			fmt.Fprintf(stderrOrDiscard(req), "pulse: docker: the exec wrapper stopped (%s)\n", oc.status)
			why, code, _ := strings.Cut(oc.status, " ")
			res.Overlay = nil
			lost = fmt.Errorf("docker: the command ran but what it changed could not be listed (%s): %w", why, backend.ErrOverlayLost)
			if n, err := strconv.Atoi(code); err == nil {
				res.ExitCode = n
			} else if inspect != nil {
				if n, ok := inspect(); ok {
					res.ExitCode = n
				}
			}
		}
		if oc.signal > 0 {
			res.Termination = backend.Signaled
			res.ExitCode = -1
			if oc.signal == 9 && oom() {
				res.Termination = backend.OOM
				fmt.Fprintf(stderrOrDiscard(req), "pulse: docker: oom: the container ran out of memory (%s); raise limits.memory_bytes in the policy\n", memory)
			}
		}
		if oc.warn != "" {
			fmt.Fprintf(stderrOrDiscard(req), "pulse: docker: %s\n", oc.warn)
		}
	}
	if oc != nil {
		switch {
		case oc.basefail:
			m = mergedUnknown
		case oc.nomerge && m == mergedKnown:
			m = mergedNone
		}
		if oc.disk != "" {
			// The command's own exit status stands: it ended on the
			// error the kernel gave its write.
			res.Termination = backend.DiskLimit
			fmt.Fprintf(stderrOrDiscard(req), "pulse: docker: %s\n", diskFullMessage(oc.disk, scratch))
		}
	}
	return m, lost, nil
}

// memoryLimitNote says what the container's memory limit is made of.
func (b *Backend) memoryLimitNote() string {
	n, asked := b.scratchBytes()
	if asked {
		return fmt.Sprintf("limits.memory_bytes, %d bytes, plus the %d bytes of its workspace space", b.o.limits.MemoryBytes, n)
	}
	return fmt.Sprintf("limits.memory_bytes, %d bytes, its workspace space of %d bytes included", b.o.limits.MemoryBytes, n)
}

// oomSince says whether the engine saw the kernel's OOM killer end a
// process of container id since a little before start (a second, for
// the engine's clock).
func (b *Backend) oomSince(id string, start time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	since := start.Add(-time.Second)
	msgs, errs := b.cli.Events(ctx, events.ListOptions{
		Since:   strconv.FormatInt(since.Unix(), 10),
		Until:   strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10),
		Filters: filters.NewArgs(filters.Arg("container", id), filters.Arg("event", "oom")),
	})
	for {
		select {
		case <-msgs:
			return true
		case <-errs:
			return false // the end of the list, or no answer: not known
		}
	}
}

// diskLimitNote says how large the scratch tmpfs is, and why.
func (b *Backend) diskLimitNote() string {
	n, asked := b.scratchBytes()
	switch {
	case b.o.limits.DiskBytes > 0:
		return fmt.Sprintf("limits.disk_bytes, %d bytes", n)
	case asked:
		return fmt.Sprintf("%d bytes, set by the caller", n)
	}
	return fmt.Sprintf("%d bytes: half of limits.memory_bytes, at most %d MiB, as limits.disk_bytes is not set", n, defaultScratch>>20)
}

// diskFullMessage says which of the container's tmpfs a command filled
// (the wrapper's list: /work, /tmp) and how to give it more.
func diskFullMessage(which, scratch string) string {
	var parts []string
	for _, w := range strings.Fields(which) {
		switch w {
		case "/work":
			parts = append(parts, "the container's workspace space ("+scratch+
				"; it holds the workspace, each running command's copy of it and what they write); raise limits.disk_bytes in the policy")
		case "/tmp":
			parts = append(parts, fmt.Sprintf("/tmp (%d MiB, fixed); write large files in the workspace or a cache instead", tmpfsBytes>>20))
		}
	}
	if len(parts) == 0 {
		return "the command filled a disk of the container"
	}
	return "disk_limit: the command's writes filled " + strings.Join(parts, ", and ") +
		"; what it wrote up to there is kept"
}

// startFresh runs the wrapper in an exec of its own: for commands with
// stdin, or too large for a pooled exec.
func (b *Backend) startFresh(bx *box, j *job, req *backend.Request, args []string) (abandon func(), inspect func() (int, bool), err error) {
	if req.TTY != nil {
		return b.startTTY(bx, j, req, args) // tty.go
	}
	execID, hj, err := b.attachCmd(bx, append(slices.Clip(wrapperCmd), args...), req.Stdin != nil)
	if err != nil {
		return nil, nil, err
	}
	if req.Stdin != nil {
		go func() {
			_, _ = io.Copy(hj.Conn, req.Stdin)
			_ = hj.CloseWrite()
		}()
	}
	go func() {
		_, err := stdcopy.StdCopy(j.out, j.err, hj.Reader)
		if err != nil {
			b.log.Warn("exec output stream ended with an error", "exec", execID, "err", err)
		}
		j.out.flush()
		j.err.flush()
		hj.Close()
		j.finish()
	}()
	return func() { hj.Close() }, b.inspector(execID), nil
}

// attachScript starts one of the backend's scripts as the wrapper's user
// in an exec of its own in bx's container, with env added to the
// scripts' environment, and attaches to it (to its stdin only when stdin
// is set). script is the script, its $0 and its arguments.
func (b *Backend) attachScript(bx *box, script []string, stdin bool, env ...string) (string, types.HijackedResponse, error) {
	return b.attachCmd(bx, append([]string{b.shell(), "-c"}, script...), stdin, env...)
}

// attachCmd is attachScript for a program: cmd is its argv.
func (b *Backend) attachCmd(bx *box, cmd []string, stdin bool, env ...string) (string, types.HijackedResponse, error) {
	ctx := context.Background()
	ec, err := b.cli.ContainerExecCreate(ctx, bx.id, container.ExecOptions{
		User:         wrapperUser,
		AttachStdin:  stdin,
		AttachStdout: true,
		AttachStderr: true,
		Env:          append(b.scriptEnv(), env...),
		WorkingDir:   "/pulse",
		Cmd:          cmd,
	})
	if err != nil {
		return "", types.HijackedResponse{}, fmt.Errorf("docker: creating exec: %v: %w", err, backend.ErrUnavailable)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, ec.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", types.HijackedResponse{}, fmt.Errorf("docker: starting exec: %v: %w", err, backend.ErrUnavailable)
	}
	return ec.ID, hj, nil
}

// inspector is the inspect of startFresh and startTTY: the exit code of
// the exec, once the engine reports it ended (within about a second of its
// output's end), or false.
func (b *Backend) inspector(id string) func() (int, bool) {
	return func() (int, bool) {
		code, err := b.execExit(context.Background(), id, 500, 2*time.Millisecond)
		return code, err == nil
	}
}

func stderrOrDiscard(req *backend.Request) io.Writer {
	if req.Stderr != nil {
		return req.Stderr
	}
	return io.Discard
}

// killGroup runs the runtime's kill step (every process of the
// command's uid, internal/boxrt) in a second exec. It is detached: the
// command's own exec ending is what Exec waits for.
func (b *Backend) killGroup(containerID, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ec, err := b.cli.ContainerExecCreate(ctx, containerID, container.ExecOptions{
		User: wrapperUser,
		Env:  b.scriptEnv(),
		Cmd:  []string{runtimePath, "kill", id},
	})
	if err == nil {
		err = b.cli.ContainerExecStart(ctx, ec.ID, container.ExecStartOptions{Detach: true})
	}
	if err != nil {
		b.log.Warn("killing a command's process group failed", "container", containerID, "exec", id, "err", err)
	}
}

// trailerSplitter passes one stream of the command through to w until
// marker, and keeps the wrapper's report that follows it. On stdout the
// report is "SIZE\n" and SIZE bytes; on stderr (wantReport false) there is
// none. Only a tail of the output that could be the start of the marker
// is held back, so output streams undelayed in practice (the marker
// begins with a control byte).
type trailerSplitter struct {
	marker     []byte
	w          io.Writer
	limit      int
	wantReport bool

	hold     []byte
	found    bool
	overflow bool
	extra    bool // bytes after the report: the stream cannot be reused
	trailer  bytes.Buffer
	size     int // report size once the header is read; -1 before
	hdr      int // length of the "SIZE\n" header
}

func newSplitter(marker string, w io.Writer, wantReport bool) *trailerSplitter {
	return &trailerSplitter{marker: []byte(marker), w: w, limit: maxOverlayBytes + 1<<20, wantReport: wantReport, size: -1}
}

func (s *trailerSplitter) Write(p []byte) (int, error) {
	n := len(p)
	if s.found {
		s.keep(p)
		return n, nil
	}
	data := p
	if len(s.hold) > 0 {
		data = append(s.hold, p...)
		s.hold = nil
	}
	if i := bytes.Index(data, s.marker); i >= 0 {
		s.found = true
		if i > 0 {
			_, _ = s.w.Write(data[:i])
		}
		s.keep(data[i+len(s.marker):])
		return n, nil
	}
	// Hold back the longest tail that is a prefix of the marker.
	h := 0
	for k := min(len(s.marker)-1, len(data)); k > 0; k-- {
		if bytes.Equal(data[len(data)-k:], s.marker[:k]) {
			h = k
			break
		}
	}
	if len(data)-h > 0 {
		_, _ = s.w.Write(data[:len(data)-h])
	}
	if h > 0 {
		s.hold = append([]byte(nil), data[len(data)-h:]...)
	}
	return n, nil
}

func (s *trailerSplitter) keep(p []byte) {
	if len(p) == 0 {
		return
	}
	if !s.wantReport || s.complete() {
		s.extra = true
		return
	}
	if s.trailer.Len()+len(p) > s.limit {
		s.overflow = true
		return
	}
	s.trailer.Write(p)
	if s.size < 0 {
		b := s.trailer.Bytes()
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			v, err := strconv.Atoi(string(b[:i]))
			if err != nil || v < 0 || v > s.limit {
				s.overflow = true // a report we cannot read; fail closed
				return
			}
			s.size, s.hdr = v, i+1
		}
	}
	if s.size >= 0 && s.trailer.Len() > s.hdr+s.size {
		s.extra = true
	}
}

// complete reports whether the marker and the whole report were seen.
func (s *trailerSplitter) complete() bool {
	if !s.found {
		return false
	}
	if !s.wantReport {
		return true
	}
	return s.overflow || s.size >= 0 && s.trailer.Len() >= s.hdr+s.size
}

// report is the report's bytes (the tar), without the header.
func (s *trailerSplitter) report() []byte {
	b := s.trailer.Bytes()
	if s.size < 0 || len(b) < s.hdr+s.size {
		return nil
	}
	return b[s.hdr : s.hdr+s.size]
}

// flush passes on a held-back tail when the stream ended without marker.
func (s *trailerSplitter) flush() {
	if !s.found && len(s.hold) > 0 {
		_, _ = s.w.Write(s.hold)
		s.hold = nil
	}
}

// job is one command's view of the exec stream it runs on.
type job struct {
	out, err *trailerSplitter
	done     chan struct{}
	once     sync.Once
	// killed is closed once the command is to be killed: a terminal
	// exec not yet started is then not started at all (tty.go).
	killed <-chan struct{}
}

func newJob(nonce string, stdout, stderr io.Writer) *job {
	return &job{
		out:  newSplitter("\x1ePULSE-END-"+nonce+"\x1e", stdout, true),
		err:  newSplitter("\x1ePULSE-ERR-"+nonce+"\x1e", stderr, false),
		done: make(chan struct{}),
	}
}

func (j *job) complete() bool { return j.out.complete() && j.err.complete() }
func (j *job) finish()        { j.once.Do(func() { close(j.done) }) }

// capWriter passes at most limit bytes to w, then drops the rest and calls
// over once. Writes to a nil w are discarded.
type capWriter struct {
	w     io.Writer
	limit int64
	over  func()

	mu    sync.Mutex
	n     int64
	trunc bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	room := c.limit - c.n
	if c.limit > 0 && int64(len(p)) > room {
		p = p[:max(room, 0)]
		if !c.trunc {
			c.trunc = true
			c.over()
		}
	}
	c.n += int64(len(p))
	if c.w != nil && len(p) > 0 {
		if _, err := c.w.Write(p); err != nil {
			// A failing sink must not stall the command; drop the rest.
			c.w = nil
		}
	}
	return n, nil
}

func (c *capWriter) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trunc
}
