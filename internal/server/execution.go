package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/protocol"
)

// errCancelled is the cancel cause of an execution a client cancelled.
var errCancelled = errors.New("cancelled by client")

// event is one stream event, kept in memory while its execution runs.
type event struct {
	seq    int64
	stream string
	data   []byte // what the client receives: text or raw bytes
	frame  []byte
}

// execution is one running submission: its output history, the clients
// attached to it and the goroutines that run and persist it.
//
// Exactly-once delivery rests on one lock: publishing an event (append to
// history, hand to subscribers) and attaching (copy history after a seq,
// become a subscriber) both happen under mu, so an attaching client gets
// every event either from the copy or live, never both and never neither.
type execution struct {
	id, tenant string
	encoding   string
	command    json.RawMessage
	workspace  string
	ctx        context.Context
	cancel     context.CancelCauseFunc
	// done closes when the executor returns, persistStopped when the
	// persist loop has exited, finishedCh when the end is recorded and
	// sent.
	done           chan struct{}
	persistStopped chan struct{}
	finishedCh     chan struct{}

	mu     sync.Mutex
	seq    int64
	events []*event
	subs   map[*conn]struct{}
	carry  map[string][]byte // held-back partial UTF-8 per stream
	out    map[string][]byte // whole output per stream, for the result
	// omit: the result carries no output, so out stays empty and only
	// outN counts bytes against the cap.
	omit      bool
	outN      map[string]int64
	truncated bool
	maxOutput int64
	persisted int    // events[:persisted] are in the store
	result    []byte // the result frame once finished
	status    string // the final status once finished
	finished  bool
	wake      chan struct{}
	// proc is set for a process submission (process.go).
	proc *processState
}

// streamWriter feeds one stream of an execution; the backend calls Write
// from one goroutine per stream.
type streamWriter struct {
	e      *execution
	stream string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.e.publish(w.stream, p)
	return len(p), nil
}

// publish records a chunk as the next event and hands it to subscribers.
func (e *execution) publish(stream string, p []byte) {
	if len(p) == 0 {
		return
	}
	e.mu.Lock()
	e.keepOutput(stream, p)
	data := p
	if e.encoding == "" {
		buf := append(e.carry[stream], p...)
		head, tail := splitUTF8(buf)
		e.carry[stream] = append([]byte(nil), tail...)
		data = toText(head)
	} else {
		data = append([]byte(nil), p...)
	}
	if len(data) > 0 {
		e.appendLocked(stream, data)
	}
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *execution) keepOutput(stream string, p []byte) {
	room := e.maxOutput - e.outN[stream]
	if room <= 0 {
		e.truncated = true
		return
	}
	if int64(len(p)) > room {
		p = p[:room]
		e.truncated = true
	}
	e.outN[stream] += int64(len(p))
	if !e.omit {
		e.out[stream] = append(e.out[stream], p...)
	}
}

func (e *execution) appendLocked(stream string, data []byte) {
	e.seq++
	ev := &event{seq: e.seq, stream: stream, data: data, frame: protocol.StreamFrame(e.id, stream, data, e.seq, e.encoding)}
	e.events = append(e.events, ev)
	for c := range e.subs {
		if !c.out.push(ev.frame) {
			delete(e.subs, c)
		}
	}
}

// flushCarry publishes what is left of partial UTF-8 sequences at the end.
func (e *execution) flushCarry() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, stream := range []string{"stdout", "stderr"} {
		if len(e.carry[stream]) > 0 {
			e.appendLocked(stream, toText(e.carry[stream]))
			e.carry[stream] = nil
		}
	}
}

// attach sends the history after afterSeq to c, then (for a running
// execution) subscribes it. It returns false, sending nothing, when
// another client is attached.
func (e *execution) attach(c *conn, afterSeq int64, reply func() []byte) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.finished {
		for other := range e.subs {
			if other != c {
				return false
			}
		}
	}
	for _, ev := range e.events {
		if ev.seq > afterSeq {
			c.out.push(ev.frame)
		}
	}
	c.out.push(reply())
	if e.finished {
		c.out.push(e.result)
		return true
	}
	e.subs[c] = struct{}{}
	c.track(e.id)
	return true
}

func (e *execution) detach(c *conn) {
	e.mu.Lock()
	delete(e.subs, c)
	e.mu.Unlock()
}

// persistLoop writes events to the store in batches as they arrive, so
// that the publishing path never waits on disk.
func (s *Server) persistLoop(e *execution) {
	defer s.wg.Done()
	defer close(e.persistStopped)
	for {
		select {
		case <-e.wake:
			s.persist(e)
		case <-e.done:
			return
		}
	}
}

// persist writes the events not yet stored. Only persistLoop and, after
// it has stopped, finish call it.
func (s *Server) persist(e *execution) {
	e.mu.Lock()
	batch := e.events[e.persisted:]
	e.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	rows := make([]store.Event, len(batch))
	for i, ev := range batch {
		rows[i] = store.Event{ExecutionID: e.id, Seq: ev.seq, Stream: ev.stream, Data: ev.data}
	}
	// The server context may be cancelled at shutdown; history must still
	// reach the store.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.store.AppendEvents(ctx, rows); err != nil {
		s.log.Error("persist stream events", "execution_id", e.id, "err", err)
		return
	}
	e.mu.Lock()
	// The frame is kept for replay; the raw copy is only needed until
	// stored.
	for _, ev := range batch {
		ev.data = nil
	}
	e.persisted += len(batch)
	e.mu.Unlock()
}

func (e *execution) text(stream string) string {
	b := e.out[stream]
	if e.encoding == "base64" {
		return base64.StdEncoding.EncodeToString(b)
	}
	return string(toText(b))
}

// run executes e and records its end. It owns one concurrency slot.
func (s *Server) run(ctx context.Context, e *execution, req *backend.Request,
	exec func(context.Context, *backend.Request) (*backend.Result, error)) {
	defer s.wg.Done()
	start := s.o.now()
	req.Stdout = streamWriter{e: e, stream: "stdout"}
	req.Stderr = streamWriter{e: e, stream: "stderr"}
	res, err := exec(ctx, req)
	e.flushCarry()
	close(e.done)
	cause := context.Cause(ctx)

	status := store.StatusCompleted
	p := protocol.Result{ExecutionID: e.id, Command: e.command, Encoding: e.encoding}
	// A command that ran but whose writes the executor lost comes with
	// its result (backend.ErrOverlayLost): it is reported as having run.
	lost := err != nil && res != nil && errors.Is(err, backend.ErrOverlayLost)
	switch {
	case err != nil && !lost:
		s.log.Error("execution failed to start", "execution_id", e.id, "err", err)
		status = store.StatusFailed
		p.ExitCode, p.TerminationReason = -1, "error"
		if errors.Is(err, backend.ErrUnsupported) || errors.Is(err, backend.ErrInvalidRequest) || errors.Is(err, relay.ErrWorkerLost) {
			p.Stderr = err.Error()
		} else {
			p.Stderr = protocol.MsgInternal
		}
		// The class travels as a code, so the client need not read it
		// from the message.
		p.ErrorCode = protocol.CodeOf(err)
		if errors.Is(err, relay.ErrWorkerLost) {
			p.ErrorCode = protocol.CodeWorkerLost
		}
		p.DurationMS = s.o.now().Sub(start).Milliseconds()
	default:
		p.ExitCode = res.ExitCode
		p.TerminationReason = string(res.Termination)
		p.TimedOut = res.TimedOut
		p.DurationMS = res.Duration.Milliseconds()
		if res.PID != 0 {
			pid := res.PID
			p.PID = &pid
		}
		p.Network, p.NetworkDropped = protocol.WireNetwork(res.Network), res.NetworkDropped
		p.Metrics = protocol.ResultMetrics{
			MaxRSSBytes: res.Metrics.MaxRSSBytes,
			UserCPUMS:   res.Metrics.UserCPU.Milliseconds(),
			SystemCPUMS: res.Metrics.SystemCPU.Milliseconds(),
		}
		e.mu.Lock()
		p.Stdout, p.Stderr = e.text("stdout"), e.text("stderr")
		p.OutputOmitted = e.omit
		p.Truncated = res.Truncated || e.truncated
		e.mu.Unlock()
		if lost {
			s.log.Error("the command ran but its writes were lost", "execution_id", e.id, "err", err)
		} else if !res.Overlay.Empty() {
			if serr := s.saveOverlay(e, res.Overlay); serr != nil {
				s.log.Error("save overlay", "execution_id", e.id, "err", serr)
				lost = true
			} else {
				p.Artifact = true
			}
		}
		if lost {
			// The command's writes are gone: a result that looked like
			// plain success would lose them without a word.
			status = store.StatusFailed
			p.Error, p.ErrorCode = protocol.ResultOverlayLost, protocol.CodeOverlayLost
		}
	}
	if ctx.Err() != nil && !p.TimedOut {
		// Cancelled by a client, or by the server shutting down: either
		// way the command did not reach its own end.
		status = store.StatusFailed
		if p.Error == "" { // a lost overlay says more than how it ended
			p.Error = "SHUTDOWN"
			if errors.Is(cause, errCancelled) {
				p.Error = protocol.StatusCancelled
			}
		}
		if p.TerminationReason == "" || p.TerminationReason == string(backend.Exited) {
			p.TerminationReason = string(backend.Cancelled)
		}
	}
	// History first, then the terminal record: a client that sees the
	// result and asks again finds every event in the store.
	<-e.persistStopped
	s.persist(e)
	e.mu.Lock()
	p.LastSeq = e.seq
	e.mu.Unlock()
	body, _ := json.Marshal(p)
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := s.store.Finish(fctx, e.id, status, body); err != nil {
		s.log.Error("record execution end", "execution_id", e.id, "err", err)
	}
	cancel()
	s.m.finished(status, time.Duration(p.DurationMS)*time.Millisecond)
	s.log.Info("execution finished", "execution_id", e.id, "tenant", e.tenant, "status", status,
		"exit_code", p.ExitCode, "termination", p.TerminationReason)

	// Out of the active set before the result goes out: a client that has
	// it and at once reconciles, or submits into the slot it freed, must
	// find the execution ended (the store says so already; a request that
	// reads it now reads the terminal record).
	s.mu.Lock()
	delete(s.active, e.id)
	s.slots--
	s.m.setActive(s.slots)
	s.mu.Unlock()

	e.mu.Lock()
	e.result = protocol.RawFrame(protocol.TypeResult, body)
	e.status = status
	e.finished = true
	for c := range e.subs {
		c.out.push(e.result)
	}
	e.subs = nil
	e.mu.Unlock()
	close(e.finishedCh)
}

func (s *Server) saveOverlay(e *execution, ov *backend.Overlay) error {
	data, err := protocol.PackOverlay(contentOnly(ov))
	if err != nil {
		return err
	}
	dst := s.overlayFile(e.tenant, e.id)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// contentOnly is ov without the FIFOs, sockets and device nodes a local
// backend reports (backend.File): the overlay archive carries workspace
// content only, as every client of the wire reads it, and they are not
// content.
func contentOnly(ov *backend.Overlay) *backend.Overlay {
	if !slices.ContainsFunc(ov.Files, backend.File.Special) {
		return ov
	}
	out := &backend.Overlay{Deleted: ov.Deleted}
	for _, f := range ov.Files {
		if !f.Special() {
			out.Files = append(out.Files, f)
		}
	}
	return out
}
