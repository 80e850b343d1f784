package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/pulse-agent/pulse/backend"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
)

// call runs one Exec on w and waits for its terminal frame. Cancelling ctx
// sends Abort and still waits for the worker's answer (End{-1}), bounded
// by the worker's liveness.
func (r *Relay) call(ctx context.Context, w *worker, ex *sandboxv1.Exec, onChunk func(sandboxv1.Stream, []byte)) (execEnd, bool) {
	ex.ReqId = r.reqID.Add(1)
	p := &pendingExec{onChunk: onChunk, end: make(chan execEnd, 1)}
	w.mu.Lock()
	if w.lost != nil {
		w.mu.Unlock()
		return execEnd{err: w.lost, exitCode: -1}, false
	}
	w.pending[ex.ReqId] = p
	w.mu.Unlock()
	if err := w.send(&sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Exec{Exec: ex}}); err != nil {
		w.mu.Lock()
		delete(w.pending, ex.ReqId)
		w.mu.Unlock()
		return execEnd{err: fmt.Errorf("worker %s: send: %v: %w", w.id, err, ErrWorkerLost), exitCode: -1}, false
	}
	aborted := false
	select {
	case e := <-p.end:
		return e, false
	case <-ctx.Done():
		aborted = true
		w.send(&sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Abort{Abort: &sandboxv1.Abort{ReqId: ex.ReqId}}})
	}
	select {
	case e := <-p.end:
		return e, aborted
	case <-time.After(r.o.liveness):
		w.mu.Lock()
		delete(w.pending, ex.ReqId)
		w.mu.Unlock()
		return execEnd{err: fmt.Errorf("worker %s did not confirm the abort: %w", w.id, ErrWorkerLost), exitCode: -1}, aborted
	}
}

func endErr(step string, e execEnd) error {
	switch {
	case e.err != nil:
		return fmt.Errorf("%s: %w", step, e.err)
	case e.isError:
		return fmt.Errorf("%s: worker: %s: %w", step, e.message, backend.ErrUnavailable)
	case e.exitCode != 0:
		return fmt.Errorf("%s: exit status %d: %w", step, e.exitCode, backend.ErrUnavailable)
	}
	return nil
}

type requiresKey struct{}

// WithRequires passes a submission's required programs to Exec, which
// runs it only on a worker that has them all.
func WithRequires(ctx context.Context, requires []string) context.Context {
	if len(requires) == 0 {
		return ctx
	}
	return context.WithValue(ctx, requiresKey{}, requires)
}

func requiresFrom(ctx context.Context) []string {
	r, _ := ctx.Value(requiresKey{}).([]string)
	return r
}
