package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/artifact"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// handle answers one client frame. Every reply to a request carries its
// request_id (null when the request had none or an invalid one).
func (c *conn) handle(data []byte) {
	m, err := protocol.ParseMessage(data)
	if err != nil {
		c.s.log.Info("rejected an invalid protocol message", "tenant", c.tenant, "err", err)
		c.out.push(protocol.ErrorFrame("", protocol.MsgInvalid, protocol.CodeInvalid))
		return
	}
	c.s.m.action(m.Action)
	if h := handlers[m.Action]; h != nil {
		err = h(c, c.ctx, m)
	} else {
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgUnknown, protocol.CodeUnknown))
	}
	c.fail(m, err)
}

// fail answers m with the error frame err calls for, if err is not nil.
func (c *conn) fail(m *protocol.Message, err error) {
	if err != nil {
		code := protocol.CodeInvalid
		if !errors.Is(err, protocol.ErrInvalid) {
			code = protocol.CodeInternal
			c.s.log.Error("request failed", "action", m.Action, "tenant", c.tenant, "err", err)
		} else {
			c.s.log.Info("rejected an invalid request", "action", m.Action, "tenant", c.tenant, "err", err)
		}
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgInvalid, code))
	}
}

// handler answers one action; an error wrapping protocol.ErrInvalid is
// answered as an invalid request, any other as an internal error.
type handler func(c *conn, ctx context.Context, m *protocol.Message) error

// handlers are the actions a client may send.
var handlers = map[string]handler{
	protocol.ActionSubmit:       (*conn).submit,
	protocol.ActionCancel:       withID((*conn).cancelExec),
	protocol.ActionStatus:       withID((*conn).status),
	protocol.ActionAttach:       withID((*conn).attach),
	protocol.ActionUpload:       withID((*conn).upload),
	protocol.ActionDownload:     withID((*conn).download),
	protocol.ActionReconcile:    (*conn).reconcile,
	protocol.ActionCapabilities: (*conn).capabilities,
	protocol.ActionSignal:       (*conn).signal, // process.go
	protocol.ActionStdin:        (*conn).stdin,
	protocol.ActionResize:       (*conn).resize,
}

// withID is h for an action about one execution: the payload's
// execution_id, validated, is h's id.
func withID(h func(c *conn, ctx context.Context, m *protocol.Message, id string) error) handler {
	return func(c *conn, ctx context.Context, m *protocol.Message) error {
		id, err := m.ExecutionID()
		if err != nil {
			return err
		}
		return h(c, ctx, m, id)
	}
}

func (c *conn) capabilities(_ context.Context, m *protocol.Message) error {
	c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusCapabilities, c.s.capabilitiesAnswer()))
	return nil
}

// capabilitiesAnswer is what the capabilities action answers, and the
// upgrade's protocol.HeaderCapabilities when a client asks for it there.
func (s *Server) capabilitiesAnswer() map[string]any {
	return map[string]any{
		"executor": s.exec.Name(), "capabilities": s.exec.Capabilities(),
		"features": s.features(), "max_stdin_bytes": protocol.MaxStdinBytes, "max_limits": s.maxLimits(),
	}
}

func (c *conn) submit(ctx context.Context, m *protocol.Message) error {
	s := c.s
	// Reserve a slot first, as the Python server checked capacity before
	// anything else; the reservation is atomic, so N racing submits can
	// never start more than the limit.
	s.mu.Lock()
	if s.draining.Load() || s.slots >= s.o.maxConcurrent {
		s.mu.Unlock()
		s.m.rejected("capacity")
		s.log.Warn("concurrency limit reached, rejecting execution", "tenant", c.tenant)
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgCapacity, protocol.CodeCapacity))
		return nil
	}
	s.slots++
	s.mu.Unlock()
	release := func() {
		s.mu.Lock()
		s.slots--
		s.mu.Unlock()
	}
	req, err := protocol.ParseSubmit(m.Payload)
	if err != nil {
		release()
		s.m.rejected("invalid")
		return err
	}
	if msg := s.processRefusal(req); msg != "" {
		release()
		s.m.rejected("unsupported")
		c.out.push(protocol.ErrorFrame(m.RequestID, msg, protocol.CodeUnsupported))
		return nil
	}
	if err := s.exec.Available(req.Requires); err != nil {
		release()
		s.m.rejected("capacity")
		s.log.Warn("executor has no capacity, rejecting execution", "tenant", c.tenant, "err", err)
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgCapacity, protocol.CodeCapacity))
		return nil
	}
	net, sec := s.o.network, s.o.secrets
	if req.Network != nil {
		net = *req.Network
	}
	if req.Secrets != nil {
		sec = *req.Secrets
	}
	caps := s.exec.Capabilities()
	if caps.NetworkLevel(net.Mode) == policy.Unsupported || caps.SecretLevel(sec.Mode) == policy.Unsupported {
		release()
		s.m.rejected("unsupported")
		msg := fmt.Sprintf("executor %s cannot enforce network %q with secrets %q", s.exec.Name(), net.Mode, sec.Mode)
		if s.exec.Name() == "relay" {
			msg += "; no attached pulse-worker makes boxes (each says why at start), and a worker without them cannot restrict a " +
				"command's network: run workers where user namespaces are allowed (docs/security.md), or allow network " +
				"and secrets in the policy (pulse exec --policy examples/fleet-policy.yaml --secrets allow-all)"
		}
		c.out.push(protocol.ErrorFrame(m.RequestID, msg, protocol.CodeUnsupported))
		return nil
	}

	lk := s.idLock(req.ExecutionID)
	lk.Lock()
	if req.Workspace != nil {
		if refusal := c.inlineWorkspace(ctx, m.RequestID, req); refusal != nil {
			lk.Unlock()
			release()
			c.out.push(refusal)
			return nil
		}
	}
	e, err := c.register(ctx, req, net)
	if err != nil && req.Workspace != nil {
		// The workspace was made for this submission alone, under the
		// id's lock: nothing else has it.
		s.removeWorkspace(c.tenant, req.ExecutionID)
	}
	lk.Unlock()
	if err != nil {
		release()
		if errors.Is(err, store.ErrExists) {
			s.m.rejected("duplicate")
			c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgInvalid, protocol.CodeDuplicate))
			return nil
		}
		s.m.rejected("internal")
		return err
	}
	limits := s.effectiveLimits(req.Limits, req.Timeout)
	// Nothing runs yet, so the cap can be set without the lock.
	e.maxOutput = limits.OutputBytes
	s.m.setActive(s.activeSlots())
	// The submitter is subscribed from the start (register), and the
	// acknowledgement is queued before the command starts, so it precedes
	// every stream event.
	ack := map[string]any{"execution_id": req.ExecutionID}
	if req.Limits != nil {
		// Tell a client that asked for limits what it got after clamping.
		shown := limits
		shown.Timeout = 0
		ack["limits"] = shown
	}
	starting := protocol.ResponseFrame(m.RequestID, protocol.StatusStarting, ack)
	if !req.Process {
		c.out.push(starting)
	}
	s.log.Info("execution started", "execution_id", e.id, "tenant", c.tenant, "correlation_id", req.CorrelationID)

	breq := &backend.Request{
		ExecutionID: req.ExecutionID,
		Workspace:   e.workspace,
		Args:        req.Args,
		Shell:       req.Shell,
		Dir:         req.Cwd,
		Env:         req.Env,
		Limits:      limits,
		Network:     net,
		Secrets:     sec,
	}
	breq.Env, breq.Egress = injectInto(net, req.Env, req.Inject) // egress.go
	if req.Stdin != nil {
		breq.Stdin = bytes.NewReader(req.Stdin)
	}
	if req.TTY != nil {
		breq.TTY = &backend.TTY{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
	}
	exec := s.exec.Exec
	if req.Process {
		// STARTING answers once the command runs (or an error frame says
		// why it did not).
		exec = func(ctx context.Context, breq *backend.Request) (*backend.Result, error) {
			return s.startProcess(ctx, e, breq, func(err error) { e.ackProcess(c, m.RequestID, starting, err) })
		}
	}
	s.wg.Add(2)
	go s.persistLoop(e)
	go func() {
		defer e.cancel(nil)
		s.run(relay.WithRequires(e.ctx, req.Requires), e, breq, exec)
	}()
	return nil
}

// inlineWorkspace makes the workspace a submission carries
// (FeatureWorkspace) as upload would make it, and returns nil; or the
// frame that refuses the submission: DUPLICATE for an id already
// submitted, the upload's error for an archive upload would refuse. The
// caller holds the id's lock. The id's record is not looked up first:
// the workspace is a directory made exclusively (it cannot be a live or
// ended execution's that still has one), and register's insert is what
// claims the id, after which a failed claim removes it.
func (c *conn) inlineWorkspace(ctx context.Context, requestID string, req *protocol.SubmitRequest) []byte {
	s, id := c.s, req.ExecutionID
	err := artifact.Extract(req.Workspace, s.workspaceDir(c.tenant, id), s.o.limits)
	if err == nil {
		return nil
	}
	if errors.Is(err, artifact.ErrExists) {
		if taken, serr := s.store.Exists(ctx, id); serr == nil && taken {
			s.m.rejected("duplicate")
			return protocol.ErrorFrame(requestID, protocol.MsgInvalid, protocol.CodeDuplicate)
		}
	}
	s.log.Warn("artifact upload rejected", "execution_id", id, "tenant", c.tenant, "err", err)
	s.m.rejected("artifact")
	return protocol.ErrorFrame(requestID, protocol.MsgUpload, protocol.CodeUpload)
}

// register claims the execution id: in memory, then in the store, and
// makes sure its workspace exists.
func (c *conn) register(ctx context.Context, req *protocol.SubmitRequest, network policy.NetworkPolicy) (*execution, error) {
	s := c.s
	e := &execution{
		id: req.ExecutionID, tenant: c.tenant, encoding: req.Encoding, command: req.RawCommand,
		workspace: s.workspaceDir(c.tenant, req.ExecutionID),
		done:      make(chan struct{}), persistStopped: make(chan struct{}), finishedCh: make(chan struct{}),
		subs: map[*conn]struct{}{c: {}}, carry: map[string][]byte{}, out: map[string][]byte{},
		omit: req.OmitOutput, outN: map[string]int64{},
		maxOutput: s.o.maxOutput, wake: make(chan struct{}, 1),
	}
	if req.Process {
		// The submitter is subscribed once the command runs
		// (ackProcess), after its acknowledgement.
		e.proc = newProcessState(network)
		delete(e.subs, c)
	}
	// The execution's context hangs off the server's, not the
	// connection's: a client that goes away does not stop its command.
	e.ctx, e.cancel = context.WithCancelCause(s.ctx)
	s.mu.Lock()
	if _, dup := s.active[e.id]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", e.id, store.ErrExists)
	}
	s.active[e.id] = e
	s.mu.Unlock()
	c.track(e.id)
	unregister := func() {
		e.cancel(nil)
		s.mu.Lock()
		delete(s.active, e.id)
		s.mu.Unlock()
	}
	if err := s.store.Create(ctx, store.Execution{ID: e.id, Tenant: c.tenant, CorrelationID: req.CorrelationID, Encoding: req.Encoding}); err != nil {
		unregister()
		return nil, err
	}
	// No upload means an empty workspace; an upload made it already.
	if err := os.MkdirAll(e.workspace, 0o700); err != nil {
		unregister()
		fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.store.Finish(fctx, e.id, store.StatusFailed, nil)
		cancel()
		return nil, fmt.Errorf("workspace: %w", err)
	}
	return e, nil
}

func (s *Server) activeSlots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots
}

// lookup returns the running execution id when it belongs to tenant.
func (s *Server) lookup(id, tenant string) *execution {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.active[id]; e != nil && e.tenant == tenant {
		return e
	}
	return nil
}

// live returns the running execution id of c's tenant, or answers for
// it and returns nil: "Execution is not running: STATUS" for one of the
// tenant's that ended, notFound for any other id. Another tenant's
// execution and one that never existed answer the same, so ids leak
// nothing across tenants.
func (c *conn) live(ctx context.Context, requestID, id, notFound string) *execution {
	if e := c.s.lookup(id, c.tenant); e != nil {
		return e
	}
	if rec, err := c.s.store.Get(ctx, id, c.tenant); err == nil {
		c.out.push(protocol.ErrorFrame(requestID, "Execution is not running: "+rec.Status, protocol.CodeNotRunning))
		return nil
	}
	c.out.push(protocol.ErrorFrame(requestID, notFound, protocol.CodeNotFound))
	return nil
}

func (c *conn) cancelExec(ctx context.Context, m *protocol.Message, id string) error {
	e := c.live(ctx, m.RequestID, id, protocol.MsgUnauthorized)
	if e == nil {
		return nil
	}
	e.cancel(errCancelled)
	select {
	case <-e.finishedCh:
	case <-time.After(c.s.o.cancelWait):
		c.s.log.Warn("cancelled execution still ending", "execution_id", id)
	case <-ctx.Done():
		return nil
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusCancelled, map[string]any{"execution_id": id}))
	return nil
}

func (c *conn) status(ctx context.Context, m *protocol.Message, id string) error {
	rec, err := c.s.store.Get(ctx, id, c.tenant)
	if errors.Is(err, store.ErrNotFound) {
		c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusNotFound, nil))
		return nil
	}
	if err != nil {
		return err
	}
	extra := map[string]any{
		"execution_id": id,
		"created_at":   rec.CreatedAt.UTC().Format(time.RFC3339Nano),
		"updated_at":   rec.UpdatedAt.UTC().Format(time.RFC3339Nano),
	}
	if rec.CorrelationID != "" {
		extra["correlation_id"] = rec.CorrelationID
	}
	if why := store.ReasonOf(rec); why != "" {
		extra["reason"] = why
	}
	if e := c.s.lookup(id, c.tenant); e != nil {
		e.mu.Lock()
		extra["last_seq"] = e.seq
		e.mu.Unlock()
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, rec.Status, extra))
	return nil
}

func (c *conn) attach(ctx context.Context, m *protocol.Message, id string) error {
	var after int64
	if v, ok := m.Payload["after_seq"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &after); err != nil || after < 0 {
			return fmt.Errorf("after_seq must be a non-negative integer: %w", protocol.ErrInvalid)
		}
	}
	if e := c.s.lookup(id, c.tenant); e != nil {
		ok := e.attach(c, after, func() []byte {
			if e.finished {
				return protocol.ResponseFrame(m.RequestID, e.status, map[string]any{"execution_id": id})
			}
			return protocol.ResponseFrame(m.RequestID, protocol.StatusAttached, map[string]any{"execution_id": id})
		})
		if !ok {
			c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgAttached, protocol.CodeAttached))
		}
		return nil
	}
	rec, err := c.s.store.Get(ctx, id, c.tenant)
	if errors.Is(err, store.ErrNotFound) {
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgNotFound, protocol.CodeNotFound))
		return nil
	}
	if err != nil {
		return err
	}
	if w, ok := c.s.store.(store.Watcher); ok && rec.Status == store.StatusRunning {
		// Running on another replica sharing the store: follow its rows
		// live. Not tracked by the server's wait group: it ends with the
		// connection, which shutdown closes.
		go c.follow(ctx, w, m.RequestID, id, after)
		return nil
	}
	if rec.Status == store.StatusRunning {
		// Not running here, yet RUNNING in the store: it finished between
		// the two lookups and its record is being written. Read again.
		time.Sleep(50 * time.Millisecond)
		if rec, err = c.s.store.Get(ctx, id, c.tenant); err != nil {
			return err
		}
	}
	events, err := c.s.store.Events(ctx, id, after)
	if err != nil {
		return err
	}
	for _, ev := range events {
		if !c.out.push(protocol.StreamFrame(id, ev.Stream, ev.Data, ev.Seq, rec.Encoding)) {
			return nil
		}
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, rec.Status, terminalExtra(id, rec)))
	if (rec.Status == store.StatusCompleted || rec.Status == store.StatusFailed) && rec.Result != nil {
		c.out.push(protocol.RawFrame(protocol.TypeResult, rec.Result))
	}
	return nil
}

// terminalExtra is the payload of the answer to an attach that finds rec
// ended: its id, and for an UNKNOWN record the reason the store gives
// (an additive field: which replica stopped while it ran).
func terminalExtra(id string, rec store.Execution) map[string]any {
	extra := map[string]any{"execution_id": id}
	if why := store.ReasonOf(rec); why != "" {
		extra["reason"] = why
	}
	return extra
}

// followPoll is how often follow reads the store with no signal from it:
// the safety net for a notification the database or the listener lost.
const followPoll = 2 * time.Second

// follow serves an attach to an execution another replica runs, from the
// shared store: the events after afterSeq, then the ATTACHED answer, then
// each event as the running replica appends it, then the result. Every
// read asks for the events after the last one sent, so a signal lost or
// merged with another delays an event but never loses or repeats one.
// The record is read before the events: once it is terminal, the events
// read after it are all there are (the running replica stores them
// first).
func (c *conn) follow(ctx context.Context, w store.Watcher, reqID, id string, after int64) {
	wake, stop := w.Watch(id)
	defer stop()
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	replied := false
	for {
		rec, err := c.s.store.Get(ctx, id, c.tenant)
		var events []store.Event
		if err == nil {
			events, err = c.s.store.Events(ctx, id, after)
		}
		if err != nil {
			if ctx.Err() == nil {
				c.s.log.Error("follow an execution in the store", "execution_id", id, "err", err)
				c.out.push(protocol.ErrorFrame(reqID, protocol.MsgInternal, protocol.CodeInternal))
			}
			return
		}
		for _, ev := range events {
			if !c.out.push(protocol.StreamFrame(id, ev.Stream, ev.Data, ev.Seq, rec.Encoding)) {
				return
			}
			after = ev.Seq
		}
		running := rec.Status == store.StatusRunning
		followed := replied // ATTACHED was answered: the end needs a frame
		if !replied {
			replied = true
			status := rec.Status
			if running {
				status = protocol.StatusAttached
			}
			c.out.push(protocol.ResponseFrame(reqID, status, terminalExtra(id, rec)))
		}
		if !running {
			if followed && rec.Status == store.StatusUnknown {
				// Followed while RUNNING, then swept: say how it ended,
				// since no result frame will.
				c.out.push(protocol.ResponseFrame(reqID, rec.Status, terminalExtra(id, rec)))
			}
			if (rec.Status == store.StatusCompleted || rec.Status == store.StatusFailed) && rec.Result != nil {
				c.out.push(protocol.RawFrame(protocol.TypeResult, rec.Result))
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-tick.C:
		}
	}
}

func (c *conn) upload(ctx context.Context, m *protocol.Message, id string) error {
	var b64 string
	if json.Unmarshal(m.Payload["data"], &b64) != nil || b64 == "" {
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgUpload, protocol.CodeUpload))
		return nil
	}
	data, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgUpload, protocol.CodeUpload))
		return nil
	}
	s := c.s
	// An upload may only create the workspace of an execution that was
	// not submitted yet; the lock orders it against submit's check.
	lk := s.idLock(id)
	lk.Lock()
	defer lk.Unlock()
	taken, err := s.store.Exists(ctx, id)
	if err != nil {
		return err
	}
	if taken {
		s.log.Info("upload for a submitted execution refused", "execution_id", id, "tenant", c.tenant)
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgUpload, protocol.CodeUpload))
		return nil
	}
	if err := artifact.Extract(data, s.workspaceDir(c.tenant, id), s.o.limits); err != nil {
		s.log.Warn("artifact upload rejected", "execution_id", id, "tenant", c.tenant, "err", err)
		s.m.rejected("artifact")
		c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgUpload, protocol.CodeUpload))
		return nil
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusUploaded, map[string]any{"execution_id": id}))
	return nil
}

func (c *conn) download(ctx context.Context, m *protocol.Message, id string) error {
	if _, err := c.s.store.Get(ctx, id, c.tenant); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgNotFound, protocol.CodeNotFound))
			return nil
		}
		return err
	}
	data, err := os.ReadFile(c.s.overlayFile(c.tenant, id))
	if errors.Is(err, fs.ErrNotExist) {
		c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusNoArtifact, map[string]any{"execution_id": id}))
		return nil
	}
	if err != nil {
		return err
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusDownloaded, map[string]any{
		"execution_id": id, "data": base64.StdEncoding.EncodeToString(data),
	}))
	return nil
}

// reconcile runs beside the requests that follow it on the connection,
// the one exception to their order: a client that connects to run one
// command sends reconcile and then its submit at once, and removing the
// last command's workspace (thousands of files, for a repository) would
// otherwise hold the submit back. That is safe because reconcileOne
// decides under the id's lock and keeps what a live execution or a fresh
// upload needs, whatever else runs meanwhile.
//
// It runs under the server's context, not the connection's: that client
// hangs up as soon as its command has ended, often before the removals
// have, and they must not then stop part way (with an error logged for a
// request no one waits for). Shutdown ends them with the rest. Once
// Shutdown has begun (draining, set under s.mu) it runs in place as the
// other requests do, so that no s.wg.Add can come beside Shutdown's Wait.
func (c *conn) reconcile(ctx context.Context, m *protocol.Message) error {
	s := c.s
	s.mu.Lock()
	inPlace := s.draining.Load()
	if !inPlace {
		s.wg.Add(1)
	}
	s.mu.Unlock()
	if inPlace {
		return c.reconcileAll(ctx, m)
	}
	go func() {
		defer s.wg.Done()
		c.fail(m, c.reconcileAll(s.ctx, m))
	}()
	return nil
}

// reconcileAll removes the tenant's workspaces that no execution needs:
// those of executions that ended, and uploads never submitted within the
// upload grace period. A fresh upload waiting for its submit is kept.
func (c *conn) reconcileAll(ctx context.Context, m *protocol.Message) error {
	s := c.s
	entries, err := os.ReadDir(s.tenantDir(c.tenant))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	orphans := 0
	for _, ent := range entries {
		id := ent.Name()
		if !ent.IsDir() || !protocol.ValidID(id) {
			continue
		}
		removed, err := c.reconcileOne(ctx, ent)
		if err != nil {
			return err
		}
		if removed {
			orphans++
		}
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusReconciled, map[string]any{"orphans_cleaned": orphans}))
	return nil
}

// reconcileOne removes the workspace ent when no execution needs it.
func (c *conn) reconcileOne(ctx context.Context, ent fs.DirEntry) (bool, error) {
	s, id := c.s, ent.Name()
	lk := s.idLock(id)
	lk.Lock()
	defer lk.Unlock()
	if s.lookup(id, c.tenant) != nil {
		return false, nil
	}
	rec, err := s.store.Get(ctx, id, c.tenant)
	switch {
	case err == nil && rec.Status == store.StatusRunning:
		return false, nil
	case errors.Is(err, store.ErrNotFound):
		info, ierr := ent.Info()
		if ierr != nil || s.o.now().Sub(info.ModTime()) < s.o.uploadGrace {
			return false, nil
		}
	case err != nil:
		return false, err
	}
	s.removeWorkspace(c.tenant, id)
	return true, nil
}
