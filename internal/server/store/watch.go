package store

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Watcher is a store whose writes one replica makes another can wait on:
// the Postgres store, shared by replicas. The SQLite store is one
// server's own, whose executions are all in its memory, and is not one.
type Watcher interface {
	// Watch returns a channel that receives (coalesced: one pending wake
	// at most) after any replica appends events of execution id or
	// finishes its record, and after the store may have missed such a
	// signal (its listening connection was lost). A wake says "read
	// again", never what changed: the store's rows are the truth, so a
	// dropped or merged signal loses nothing for a reader that re-reads
	// after the last seq it has. stop ends the watch.
	Watch(id string) (wake <-chan struct{}, stop func())
}

var _ Watcher = (*Postgres)(nil)

// notifyChannel is the Postgres NOTIFY channel of event appends and
// finished records. A payload is "<execution id>:<last seq>", the seq
// -1 for a finished record.
const notifyChannel = "pulse_events"

// listenRetry is how long the listener waits before it connects again
// after losing its connection.
const listenRetry = time.Second

// watchers is the set of watches of one store and its listener.
type watchers struct {
	mu      sync.Mutex
	byID    map[string]map[chan struct{}]struct{}
	started bool
	closed  bool // no listener starts after Close
	stop    context.CancelFunc
	done    chan struct{}
}

// Watch subscribes to the writes of execution id, starting the store's
// listening connection on first use.
func (s *Postgres) Watch(id string) (<-chan struct{}, func()) {
	w := &s.watch
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.byID == nil {
		w.byID = map[string]map[chan struct{}]struct{}{}
	}
	if w.byID[id] == nil {
		w.byID[id] = map[chan struct{}]struct{}{}
	}
	w.byID[id][ch] = struct{}{}
	if !w.started && !w.closed {
		w.started = true
		ctx, cancel := context.WithCancel(context.Background())
		w.stop, w.done = cancel, make(chan struct{})
		go s.listen(ctx, w.done)
	}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(w.byID[id], ch)
		if len(w.byID[id]) == 0 {
			delete(w.byID, id)
		}
		w.mu.Unlock()
	}
}

// close stops the listener, if one runs, and waits for it.
func (w *watchers) close() {
	w.mu.Lock()
	w.closed = true
	stop, done := w.stop, w.done
	w.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// wake signals the watches of id, or of every execution when id is "".
func (w *watchers) wake(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	signal := func(set map[chan struct{}]struct{}) {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default: // a wake is pending already; one re-read covers both
			}
		}
	}
	if id == "" {
		for _, set := range w.byID {
			signal(set)
		}
		return
	}
	signal(w.byID[id])
}

// listen holds one connection of its own (LISTEN needs a session, which
// a pooled connection is not) and hands notifications to the watches
// until ctx ends, connecting again when the connection is lost.
func (s *Postgres) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	for {
		s.listenOnce(ctx)
		// Whatever was notified while no connection listened is lost:
		// every watch reads again.
		s.watch.wake("")
		select {
		case <-ctx.Done():
			return
		case <-time.After(listenRetry):
		}
	}
}

func (s *Postgres) listenOnce(ctx context.Context) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return
	}
	// Listening now: a write made before this point, while a watch
	// already waited, is read by the wake of every watch.
	s.watch.wake("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		id, _, ok := cutPayload(n.Payload)
		if ok {
			s.watch.wake(id)
		}
	}
}

// notifyPayload is the NOTIFY payload for execution id at seq.
func notifyPayload(id string, seq int64) string {
	return id + ":" + strconv.FormatInt(seq, 10)
}

// cutPayload splits a notifyPayload; the id is everything before the
// last colon, so an id holding colons survives.
func cutPayload(p string) (id string, seq int64, ok bool) {
	i := strings.LastIndexByte(p, ':')
	if i <= 0 {
		return "", 0, false
	}
	seq, err := strconv.ParseInt(p[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return p[:i], seq, true
}
