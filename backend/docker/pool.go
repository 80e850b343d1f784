package docker

import (
	"encoding/base64"
	"io"
	"strings"
	"sync"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/pkg/stdcopy"
)

// A pooled exec runs the runtime's loop step (internal/boxrt): it reads
// one request a line (the exec step's arguments, NUL-separated, base64)
// and runs the exec step for each, in turn. A warm command then costs a
// line written to a stream that is already open, instead of a new exec,
// whose set-up in the runtime is most of the cost of running `true`.
// Commands with stdin get an exec of their own.
var loopCmd = []string{runtimePath, "loop"}

// maxIdleWorkers bounds the pooled execs kept waiting per container.
const maxIdleWorkers = 8

type worker struct {
	hj types.HijackedResponse

	mu   sync.Mutex
	cur  *job
	dead bool
}

// writer routes one stream of the worker to its current job.
type routeWriter struct {
	w   *worker
	err bool
}

func (r routeWriter) Write(p []byte) (int, error) {
	w := r.w
	w.mu.Lock()
	j := w.cur
	if j == nil {
		w.dead = true // output while idle: an escaped process; retire it
		w.mu.Unlock()
		return len(p), nil
	}
	w.mu.Unlock()
	if r.err {
		_, _ = j.err.Write(p)
	} else {
		_, _ = j.out.Write(p)
	}
	if j.complete() {
		w.mu.Lock()
		if w.cur == j {
			w.cur = nil
		}
		if j.out.extra || j.err.extra {
			w.dead = true
		}
		w.mu.Unlock()
		j.finish()
	}
	return len(p), nil
}

func (w *worker) close() {
	w.mu.Lock()
	w.dead = true
	w.mu.Unlock()
	w.hj.Close()
}

// startPooled hands the request to an idle pooled exec, starting one if
// none is idle. It returns nil when that fails, and the caller falls back
// to an exec of its own.
func (b *Backend) startPooled(bx *box, j *job, args []string) *worker {
	var w *worker
	for attempt := 0; w == nil; attempt++ {
		if attempt == 3 {
			return nil
		}
		w = bx.takeWorker()
		if w == nil {
			var err error
			if w, err = b.newWorker(bx); err != nil {
				b.log.Warn("starting a pooled exec failed", "container", bx.id, "err", err)
				return nil
			}
		}
		// Checked under the lock the reader takes when the stream ends,
		// so either it sees this job and finishes it, or we see it dead.
		w.mu.Lock()
		if w.dead {
			w.mu.Unlock()
			w.hj.Close()
			w = nil
			continue
		}
		w.cur = j
		w.mu.Unlock()
	}
	line := base64.StdEncoding.EncodeToString([]byte(strings.Join(args, "\x00"))) + "\n"
	if _, err := io.WriteString(w.hj.Conn, line); err != nil {
		b.log.Warn("writing to a pooled exec failed", "container", bx.id, "err", err)
		w.close()
		return nil
	}
	return w
}

func (b *Backend) newWorker(bx *box) (*worker, error) {
	_, hj, err := b.attachCmd(bx, loopCmd, true)
	if err != nil {
		return nil, err
	}
	w := &worker{hj: hj}
	go func() {
		_, _ = stdcopy.StdCopy(routeWriter{w: w}, routeWriter{w: w, err: true}, hj.Reader)
		hj.Close()
		w.mu.Lock()
		w.dead = true
		j := w.cur
		w.cur = nil
		w.mu.Unlock()
		if j != nil {
			j.out.flush()
			j.err.flush()
			j.finish()
		}
	}()
	return w, nil
}

// takeChan reserves bx's channel for one command; false when it has none
// or another command is on it.
func (bx *box) takeChan() bool {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.channel == "" || bx.chanBusy {
		return false
	}
	bx.chanBusy = true
	return true
}

func (bx *box) putChan() {
	bx.mu.Lock()
	bx.chanBusy = false
	bx.mu.Unlock()
}

func (bx *box) takeWorker() *worker {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	for len(bx.idle) > 0 {
		w := bx.idle[len(bx.idle)-1]
		bx.idle = bx.idle[:len(bx.idle)-1]
		w.mu.Lock()
		dead := w.dead
		w.mu.Unlock()
		if !dead {
			return w
		}
		w.hj.Close()
	}
	return nil
}

func (bx *box) putWorker(w *worker) {
	w.mu.Lock()
	ok := !w.dead && w.cur == nil
	w.mu.Unlock()
	bx.mu.Lock()
	if ok && len(bx.idle) < maxIdleWorkers {
		bx.idle = append(bx.idle, w)
		bx.mu.Unlock()
		return
	}
	bx.mu.Unlock()
	w.close()
}
