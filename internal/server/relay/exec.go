package relay

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/artifact"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

// Exec runs req with the contract of backend.Backend.Exec. The workspace
// travels to the worker through the exec protocol itself: one exec makes
// a fresh directory, some unpack the workspace into it from stdin (base64
// of a tar.gz), one runs the command there, one sends the directory back
// as a tar.gz on stdout, and the last removes it.
func (r *Relay) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	if (req.Shell == "") == (len(req.Args) == 0) {
		return nil, fmt.Errorf("exactly one of Shell and Args: %w", backend.ErrInvalidRequest)
	}
	var stdin []byte
	if req.Stdin != nil {
		var err error
		stdin, err = io.ReadAll(io.LimitReader(req.Stdin, protocol.MaxStdinBytes+1))
		if err != nil || len(stdin) > protocol.MaxStdinBytes {
			return nil, fmt.Errorf("stdin unreadable or over %d bytes: %w", protocol.MaxStdinBytes, backend.ErrInvalidRequest)
		}
	}
	packed, err := artifact.PackDir(req.Workspace, r.o.limits)
	if err != nil {
		return nil, fmt.Errorf("pack workspace: %w", err)
	}
	for attempt := 1; ; attempt++ {
		res, ran, err := r.execOn(ctx, req, packed, stdin)
		// A worker lost before the command was sent to it never ran it:
		// another may, and the execution then has an outcome instead of
		// WORKER_LOST. Once the command was sent it is never sent again.
		if ran || err == nil || !errors.Is(err, ErrWorkerLost) || attempt == maxSetupAttempts || ctx.Err() != nil {
			return res, err
		}
		r.o.log.Warn("worker lost before the command started; trying another", "execution_id", req.ExecutionID, "err", err)
	}
}

// maxSetupAttempts bounds how many workers an execution is set up on when
// each is lost before its command starts.
const maxSetupAttempts = 3

// execOn runs req on one worker it reserves. ran reports whether the
// command was sent to the worker: after that, whatever happens, it is
// not run elsewhere.
func (r *Relay) execOn(ctx context.Context, req *backend.Request, packed, stdin []byte) (res *backend.Result, ran bool, err error) {
	w, err := r.pickFor(ctx, req)
	if err != nil {
		return nil, false, err
	}
	defer r.release(w)
	// A box captures the writes itself; a worker without boxes writes
	// in place, and the snapshot is what its writes are told from.
	var snap *artifact.Snapshot
	if !w.boxes {
		if snap, err = artifact.Take(req.Workspace); err != nil {
			return nil, false, fmt.Errorf("snapshot workspace: %w", err)
		}
	}
	x := &remoteExec{r: r, w: w, log: r.o.log.With("execution_id", req.ExecutionID, "sandbox_id", w.id)}

	// Setup runs in its own context: it is quick and must not be left
	// half done when the client cancels.
	sctx := context.WithoutCancel(ctx)
	err = x.setup(sctx, packed)
	if x.dir != "" {
		defer x.removeDir(ctx)
	}
	if err != nil {
		return nil, false, err
	}
	stdin, stdinFile, err := x.sendStdin(sctx, stdin)
	if err != nil {
		return nil, false, err
	}
	res, err = x.run(ctx, req, stdin, stdinFile)
	if err != nil {
		return nil, true, err
	}
	collect := func() error { return x.collect(ctx, snap, res) }
	if w.boxes {
		collect = func() error { return x.collectOverlay(ctx, res) }
	}
	if err := collect(); err != nil {
		// The command ran: its result stands, and the error says that
		// what it wrote is gone.
		return res, true, err
	}
	return res, true, nil
}

// pickFor reserves a worker for req, waiting up to the relay's queue
// wait while every worker that could run it is busy. The server checks
// Available before it accepts a submission, but does not reserve: submits
// arriving together all pass that check and then race here for the slots
// it saw, and the losers, already acknowledged, would fail UNAVAILABLE
// although a slot frees within a command's time. A slot freed or a worker
// attached wakes them. With no live worker able to run req at all, it
// answers at once.
func (r *Relay) pickFor(ctx context.Context, req *backend.Request) (*worker, error) {
	var wait <-chan time.Time
	for {
		freed := r.freedSignal() // before the pick: a release after it is not missed
		w, n, err := r.pickOnce(ctx, req)
		if err == nil || !r.could(requiresFrom(ctx), n) {
			return w, err
		}
		if wait == nil {
			t := time.NewTimer(r.o.queueWait)
			defer t.Stop()
			wait = t.C
		}
		select {
		case <-freed:
		case <-wait:
			return nil, err
		case <-ctx.Done():
			return nil, err
		}
	}
}

// pickOnce reserves a worker for req if one is free now, or returns the
// need it could not meet. A command whose network policy is not allow-all
// needs a worker that boxes executions (an allowlist one, its egress proxy
// too): no other can enforce it. Every other command goes to a box where
// one is free; one whose secret policy is not allow-all waits for a box
// while any worker has boxes (Capabilities then calls secrets strong),
// else runs where it can.
func (r *Relay) pickOnce(ctx context.Context, req *backend.Request) (*worker, need, error) {
	requires := requiresFrom(ctx)
	switch req.Network.Mode {
	case policy.NetworkAllowAll, "":
	case policy.NetworkAllowlist:
		if w := r.pick(true, requires, egressWorker); w != nil {
			return w, egressWorker, nil
		}
		return nil, egressWorker, fmt.Errorf("no attached worker that runs an egress proxy beside its boxes has a free slot: %w", backend.ErrUnavailable)
	default:
		if w := r.pick(true, requires, boxWorker); w != nil {
			return w, boxWorker, nil
		}
		return nil, boxWorker, fmt.Errorf("no attached worker that boxes executions has a free slot: %w", backend.ErrUnavailable)
	}
	if w := r.pick(true, requires, boxWorker); w != nil {
		return w, boxWorker, nil
	}
	if boxes, _ := r.boxing(); boxes && req.Secrets.Mode != secrets.AllowAll && req.Secrets.Mode != "" {
		return nil, boxWorker, fmt.Errorf("no attached worker that boxes executions has a free slot: %w", backend.ErrUnavailable)
	}
	if w := r.pick(true, requires, anyWorker); w != nil {
		return w, anyWorker, nil
	}
	return nil, anyWorker, fmt.Errorf("no attached worker has a free slot: %w", backend.ErrUnavailable)
}

// remoteExec is one execution on one worker, through its phases:
//
//	setup          a fresh directory on the worker, the workspace archive
//	               unpacked there: one exec when it fits one frame, else
//	               makeDir, then sendWorkspace in pieces
//	sendStdin      the command's stdin, in the run frame or as a file beside
//	run            the command, its output forwarded under the cap; on a
//	               worker with boxes, in a box of its own (Exec.box)
//	collect        the directory packed back and compared: the overlay;
//	               from a box, the overlay archive it wrote beside
//	removeDir      the directory and its files gone, whatever happened
type remoteExec struct {
	r   *Relay
	w   *worker
	log *slog.Logger
	dir string // on the worker, set by makeDir
	// removed: the step that read the box's overlay removed the
	// directory too, so removeDir has nothing left to do.
	removed bool
}

// setup makes the execution's directory on the worker and unpacks the
// workspace into it. A workspace whose archive fits one Exec frame, the
// common case, travels on the stdin of the exec that makes the directory:
// each step is a process on the worker, and under load every one of them
// delays the box. A larger one goes in pieces (makeDir, sendWorkspace).
// x.dir is set once the directory exists, whatever failed after.
func (x *remoteExec) setup(ctx context.Context, packed []byte) error {
	b64 := []byte(base64.StdEncoding.EncodeToString(packed))
	if len(b64) > x.r.o.stdinPiece {
		if err := x.makeDir(ctx, nil); err != nil {
			return err
		}
		return x.sendWorkspace(ctx, b64)
	}
	return x.makeDir(ctx, b64)
}

// makeDir makes the execution's directory on the worker, and unpacks the
// base64 tar.gz b64 into it when there is one. The directory is named on
// stdout as soon as it exists, so that it is removed even when the
// unpacking fails.
func (x *remoteExec) makeDir(ctx context.Context, b64 []byte) error {
	var dirOut bytes.Buffer
	cmd := `d=$(mktemp -d "${TMPDIR:-/tmp}/pulse-exec.XXXXXXXX") && printf '%s\n' "$d"`
	step := "create workspace"
	if b64 != nil {
		cmd += ` && base64 -d | tar -xzpf - --no-same-owner -C "$d"`
		step = "create and unpack workspace"
	}
	end, _ := x.r.call(ctx, x.w, &sandboxv1.Exec{Command: cmd, Stdin: b64, TimeoutS: 300, Streaming: true},
		func(s sandboxv1.Stream, b []byte) {
			if s == sandboxv1.Stream_STDOUT && dirOut.Len() < 4096 {
				dirOut.Write(b)
			}
		})
	dir, named := strings.CutSuffix(dirOut.String(), "\n")
	valid := named && strings.HasPrefix(dir, "/") && !strings.ContainsAny(dir, "'\n\x00")
	if valid {
		x.dir = dir
	}
	if err := endErr(step, end); err != nil {
		return err
	}
	if !valid {
		return fmt.Errorf("worker %s returned workspace %q: %w", x.w.id, dir, ErrWorkerLost)
	}
	return nil
}

// removeDir removes the directory and the files beside it, whatever
// happened, within the worker's liveness even when ctx has ended.
func (x *remoteExec) removeDir(ctx context.Context) {
	if x.removed {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), x.r.o.liveness)
	defer cancel()
	if e, _ := x.r.call(cctx, x.w, &sandboxv1.Exec{Command: x.removeCmd(), TimeoutS: 60, Streaming: true}, nil); endErr("cleanup", e) != nil {
		x.log.Warn("worker workspace not removed", "dir", x.dir, "err", endErr("cleanup", e))
	}
}

// removeCmd removes the directory and every file beside it.
func (x *remoteExec) removeCmd() string {
	return "rm -rf " + shQuote(x.dir) + " " + shQuote(x.dir+".b64") + " " + shQuote(x.dir+".stdin") + " " + shQuote(x.dir+".overlay")
}

// appendFile appends data to file on the worker, in pieces of at most
// stdinPiece bytes, because a gRPC peer refuses messages over 4 MiB by
// default.
func (x *remoteExec) appendFile(ctx context.Context, step, file string, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), x.r.o.stdinPiece)
		end, _ := x.r.call(ctx, x.w, &sandboxv1.Exec{Command: "cat >> " + shQuote(file), Stdin: data[:n], TimeoutS: 120, Streaming: true}, nil)
		if err := endErr(step, end); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// sendWorkspace sends a workspace archive too large for one frame (its
// base64) in pieces and unpacks it once whole.
func (x *remoteExec) sendWorkspace(ctx context.Context, b64 []byte) error {
	b64File := x.dir + ".b64"
	if err := x.appendFile(ctx, "send workspace", b64File, b64); err != nil {
		return err
	}
	end, _ := x.r.call(ctx, x.w, &sandboxv1.Exec{
		Command:  "base64 -d < " + shQuote(b64File) + " | tar -xzpf - --no-same-owner -C " + shQuote(x.dir) + " && rm -f " + shQuote(b64File),
		TimeoutS: 300, Streaming: true,
	}, nil)
	return endErr("unpack workspace", end)
}

// sendStdin places the command's stdin. It travels with the run exec
// when it fits one frame (returned), else as a file beside the workspace,
// sent in pieces like the workspace (its name returned).
func (x *remoteExec) sendStdin(ctx context.Context, stdin []byte) (_ []byte, file string, err error) {
	if len(stdin) <= x.r.o.stdinPiece {
		return stdin, "", nil
	}
	file = x.dir + ".stdin"
	if err := x.appendFile(ctx, "send stdin", file, stdin); err != nil {
		return nil, "", err
	}
	return nil, file, nil
}

// run runs the command and tells how it ended. Output over the cap stops
// the command, as the local backends do, rather than letting it run to
// its timeout unheard.
func (x *remoteExec) run(ctx context.Context, req *backend.Request, stdin []byte, stdinFile string) (*backend.Result, error) {
	limits := req.Limits.WithDefaults()
	timeoutS := uint32(0)
	if limits.Timeout > 0 {
		timeoutS = uint32(max(1, math.Ceil(limits.Timeout.Seconds())))
	}
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	capw := &relayOutput{limit: limits.OutputBytes, out: req.Stdout, err: req.Stderr, over: stopRun}
	ex := &sandboxv1.Exec{TimeoutS: timeoutS, Streaming: true, Stdin: stdin}
	if x.w.boxes {
		box, err := boxOf(x.dir, req, stdinFile)
		if err != nil {
			return nil, err
		}
		ex.Box = box
	} else {
		ex.Command = runScript(x.dir, req, stdinFile)
	}
	start := time.Now()
	end, aborted := x.r.call(rctx, x.w, ex, capw.chunk)
	res := &backend.Result{Duration: time.Since(start), Truncated: capw.truncated,
		Network: backendEvents(end.network), NetworkDropped: int(end.networkDropped)}
	switch {
	case end.err != nil:
		return nil, end.err
	case end.isError && strings.HasPrefix(end.message, "timeout:"):
		res.ExitCode, res.Termination, res.TimedOut = -1, backend.Timeout, true
	case end.isError:
		return nil, fmt.Errorf("worker %s: %s: %w", x.w.id, end.message, backend.ErrUnavailable)
	case aborted && capw.truncated && ctx.Err() == nil:
		res.ExitCode, res.Termination = -1, backend.OutputLimit
	case aborted:
		res.ExitCode, res.Termination = int(end.exitCode), backend.Cancelled
	case capw.truncated:
		res.ExitCode, res.Termination = int(end.exitCode), backend.OutputLimit
	case end.termination == string(backend.OOM) || end.termination == string(backend.DiskLimit):
		res.ExitCode, res.Termination = int(end.exitCode), backend.TerminationReason(end.termination)
	case end.exitCode < 0:
		res.ExitCode, res.Termination = -1, backend.Signaled
	default:
		res.ExitCode, res.Termination = int(end.exitCode), backend.Exited
	}
	return res, nil
}

// collect packs the directory back and compares it with the snapshot
// taken before: what the command changed becomes res.Overlay. The command
// ran, so a failure here leaves its result standing and returns an error
// wrapping backend.ErrOverlayLost.
func (x *remoteExec) collect(ctx context.Context, snap *artifact.Snapshot, res *backend.Result) error {
	var tarOut bytes.Buffer
	var tooBig bool
	// base64 wraps lines: allow for a newline every 76 characters.
	maxB64 := base64.StdEncoding.EncodedLen(int(protocol.DefaultMaxCompressed)) * 78 / 76
	if x.r.o.limits.MaxCompressed > 0 {
		maxB64 = base64.StdEncoding.EncodedLen(int(x.r.o.limits.MaxCompressed)) * 78 / 76
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	end, _ := x.r.call(cctx, x.w, &sandboxv1.Exec{
		Command: "cd " + shQuote(x.dir) + " && tar -czf - --exclude=./.pulse . | base64", TimeoutS: 300, Streaming: true,
	}, func(s sandboxv1.Stream, b []byte) {
		if s == sandboxv1.Stream_STDOUT && !tooBig {
			if tarOut.Len()+len(b) > maxB64 {
				tooBig = true
				return
			}
			tarOut.Write(b)
		}
	})
	cancel()
	if err := endErr("collect workspace", end); err != nil || tooBig {
		return fmt.Errorf("relay: collecting the workspace (over the limit: %v): %v: %w", tooBig, err, backend.ErrOverlayLost)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(tarOut.String()), ""))
	if err != nil {
		return fmt.Errorf("relay: the collected workspace is not base64: %v: %w", err, backend.ErrOverlayLost)
	}
	ov, err := snap.DiffTar(bytes.NewReader(raw), x.r.o.limits)
	if err != nil {
		return fmt.Errorf("relay: comparing the collected workspace: %w: %w", err, backend.ErrOverlayLost)
	}
	res.Overlay = ov
	return nil
}

// collectOverlay reads the overlay archive the box wrote beside the
// directory: what the command wrote, as the box captured it. The same
// exec then removes the directory and the files beside it, which is the
// last step: one process on the worker fewer for each execution. The
// command ran, so a failure here leaves its result standing and returns
// an error wrapping backend.ErrOverlayLost.
func (x *remoteExec) collectOverlay(ctx context.Context, res *backend.Result) error {
	lim := x.r.o.limits.WithDefaults()
	var out bytes.Buffer
	var tooBig bool
	maxB64 := base64.StdEncoding.EncodedLen(int(lim.MaxCompressed)) * 78 / 76
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	end, _ := x.r.call(cctx, x.w, &sandboxv1.Exec{
		Command: "base64 < " + shQuote(x.dir+".overlay") + "; rc=$?; " + x.removeCmd() + " || exit; exit $rc", TimeoutS: 300, Streaming: true,
	}, func(s sandboxv1.Stream, b []byte) {
		if s == sandboxv1.Stream_STDOUT && !tooBig {
			if out.Len()+len(b) > maxB64 {
				tooBig = true
				return
			}
			out.Write(b)
		}
	})
	cancel()
	// The removal ran unless the exec never came to its end; a failed
	// removal exits non-zero, and removeDir tries again.
	x.removed = end.err == nil && !end.isError && end.exitCode == 0
	if err := endErr("collect overlay", end); err != nil || tooBig {
		return fmt.Errorf("relay: collecting the box's overlay (over the limit: %v): %v: %w", tooBig, err, backend.ErrOverlayLost)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(out.String()), ""))
	if err != nil {
		return fmt.Errorf("relay: the box's overlay is not base64: %v: %w", err, backend.ErrOverlayLost)
	}
	ov, err := protocol.UnpackOverlay(raw, protocol.OverlayLimits{Bytes: lim.MaxUnpacked, Members: lim.MaxMembers})
	if err != nil {
		return fmt.Errorf("relay: reading the box's overlay: %w: %w", err, backend.ErrOverlayLost)
	}
	res.Overlay = ov
	return nil
}

// boxOf is req as a worker's box runs it, in dir: the command, its
// environment (over the box's own base), the policies it enforces, and
// the secrets bound to hosts for the egress proxy beside it, which only
// an allowlist command has.
func boxOf(dir string, req *backend.Request, stdinFile string) (*sandboxv1.Box, error) {
	np := req.Network
	if np.Mode == "" {
		np.Mode = policy.NetworkAllowAll // as pickFor reads it
	}
	nj, err := json.Marshal(np)
	if err != nil {
		return nil, fmt.Errorf("network policy: %v: %w", err, backend.ErrInvalidRequest)
	}
	lim := req.Limits
	lim.Timeout, lim.OutputBytes = 0, 0 // the Exec's timeout and the relay's cap bound them
	lj, err := json.Marshal(lim)
	if err != nil {
		return nil, fmt.Errorf("limits: %v: %w", err, backend.ErrInvalidRequest)
	}
	box := &sandboxv1.Box{
		Workspace: dir, Dir: req.Dir, Args: req.Args, Shell: req.Shell, Env: req.Env,
		StdinFile: stdinFile, OverlayFile: dir + ".overlay", Network: nj, Limits: lj,
	}
	if np.Mode == policy.NetworkAllowlist && req.Egress != nil {
		for _, in := range req.Egress.Inject {
			box.Inject = append(box.Inject, &sandboxv1.Injection{Name: in.Name, Placeholder: in.Placeholder, Value: in.Value, Hosts: in.Hosts})
		}
	}
	return box, nil
}

// backendEvents are a boxed exec's connections as the backend contract
// reports them.
func backendEvents(evs []*sandboxv1.NetworkEvent) []backend.NetworkEvent {
	var out []backend.NetworkEvent
	for _, e := range evs[:min(len(evs), protocol.MaxNetworkEvents)] {
		out = append(out, backend.NetworkEvent{Method: e.GetMethod(), Host: e.GetHost(), Port: int(e.GetPort()), Addr: e.GetAddr(),
			Allowed: e.GetAllowed(), Rule: e.GetRule(), Reason: e.GetReason(), Injected: e.GetInjected(),
			Sent: e.GetSent(), Received: e.GetReceived(), Duration: time.Duration(e.GetDurationNs())})
	}
	return out
}

// relayOutput forwards chunks to the request's writers, capping each
// stream at limit bytes.
type relayOutput struct {
	mu        sync.Mutex
	limit     int64
	n         [2]int64
	out, err  interface{ Write([]byte) (int, error) }
	truncated bool
	over      func() // called when a stream goes over the cap
}

func (o *relayOutput) chunk(s sandboxv1.Stream, b []byte) {
	i := 0
	w := o.out
	if s == sandboxv1.Stream_STDERR {
		i, w = 1, o.err
	}
	o.mu.Lock()
	room := o.limit - o.n[i]
	hit := false
	if int64(len(b)) > room {
		b = b[:max(room, 0)]
		hit = !o.truncated
		o.truncated = true
	}
	o.n[i] += int64(len(b))
	o.mu.Unlock()
	if hit && o.over != nil {
		o.over()
	}
	if w != nil && len(b) > 0 {
		w.Write(b)
	}
}

// runScript builds the shell command that runs req in dir with an
// environment built from scratch, as the local backends do.
// A non-empty stdinFile becomes the command's standard input.
func runScript(dir string, req *backend.Request, stdinFile string) string {
	var b strings.Builder
	b.WriteString("cd " + shQuote(dir+"/"+strings.TrimPrefix(req.Dir, "./")) + " && exec env -i")
	base := map[string]string{"PATH": relayWorkerPath, "HOME": dir, "LANG": "C.UTF-8", "TERM": "dumb", "USER": "pulse"}
	for k, v := range req.Env {
		base[k] = v
	}
	keys := make([]string, 0, len(base))
	for k := range base {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteString(" " + shQuote(k+"="+base[k]))
	}
	if req.Shell != "" {
		b.WriteString(" bash -c " + shQuote(req.Shell))
	} else {
		// Through "$@" so that no argument, not even a first one that
		// looks like NAME=VALUE, is read by env.
		b.WriteString(` bash -c 'exec "$@"' pulse`)
		for _, a := range req.Args {
			b.WriteString(" " + shQuote(a))
		}
	}
	if stdinFile != "" {
		b.WriteString(" < " + shQuote(stdinFile))
	}
	return b.String()
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
