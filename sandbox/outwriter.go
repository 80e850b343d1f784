package sandbox

import (
	"errors"
	"io"
	"sync"
)

// errWriterAbandoned is what a backend sees once the caller's writer was
// given up on.
var errWriterAbandoned = errors.New("sandbox: output writer blocked; abandoned")

// outQueueBytes bounds what is queued for a slow caller's writer before the
// backend is made to wait too.
const outQueueBytes = 1 << 20

// outWriter sits between the backend (through the scrubber) and the
// caller's writer: it queues what the backend writes and hands it to the
// caller's writer from its own goroutine. A caller's writer that blocks
// then holds up only that goroutine, and once the sandbox gives up on it
// (abandon) the backend's writes fail at once instead of hanging, so
// Execute, the backend and Close all return. The goroutine stuck in the
// caller's Write is left behind, as a stdin reader that never returns is.
type outWriter struct {
	w    io.Writer
	mu   sync.Mutex
	cond *sync.Cond
	buf  []byte
	// spare is the buffer forward last handed to the caller's writer,
	// kept for the next turn: two buffers in turn, rather than one
	// allocation per write, which at stream rates would keep the
	// garbage collector busy.
	spare []byte
	// closed: no more writes come; abandoned: stop now, drop the rest.
	closed, abandoned bool
	err               error // the caller's writer failed
	done              chan struct{}
}

func newOutWriter(w io.Writer) *outWriter {
	o := &outWriter{w: w, done: make(chan struct{})}
	o.cond = sync.NewCond(&o.mu)
	go o.forward()
	return o
}

func (o *outWriter) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	// One write larger than the queue still goes in whole when the queue
	// is empty, so it cannot wait forever for room.
	for len(o.buf) > 0 && len(o.buf)+len(p) > outQueueBytes && !o.abandoned && o.err == nil {
		o.cond.Wait()
	}
	switch {
	case o.abandoned:
		return 0, errWriterAbandoned
	case o.err != nil:
		return 0, o.err
	case o.closed:
		return 0, io.ErrClosedPipe
	}
	o.buf = append(o.buf, p...)
	o.cond.Broadcast()
	return len(p), nil
}

func (o *outWriter) forward() {
	defer close(o.done)
	for {
		o.mu.Lock()
		for len(o.buf) == 0 && !o.closed && !o.abandoned {
			o.cond.Wait()
		}
		if o.abandoned || len(o.buf) == 0 {
			o.mu.Unlock()
			return
		}
		chunk := o.buf
		o.buf, o.spare = o.spare[:0], nil
		o.mu.Unlock()

		n, err := o.w.Write(chunk)
		if err == nil && n < len(chunk) {
			err = io.ErrShortWrite
		}
		o.mu.Lock()
		if err != nil {
			o.err = err
		}
		// The caller's writer is done with chunk (io.Writer may not
		// retain it); one much larger than the queue, from a single large
		// Write, is not kept.
		if cap(chunk) <= 2*outQueueBytes {
			o.spare = chunk
		}
		o.cond.Broadcast()
		o.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// close says no more writes come and waits until the queue has reached the
// caller's writer, or until giveUp is closed, when it abandons the rest.
// It returns the caller's writer's error, if any.
func (o *outWriter) close(giveUp <-chan struct{}) error {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
	select {
	case <-o.done:
	case <-giveUp:
		o.abandon()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.abandoned && o.err == nil {
		return errWriterAbandoned
	}
	return o.err
}

// abandon drops what is queued and makes every later Write fail.
func (o *outWriter) abandon() {
	o.mu.Lock()
	if !o.abandoned {
		o.abandoned = true
		o.buf, o.spare = nil, nil
		o.cond.Broadcast()
	}
	o.mu.Unlock()
}
