package sandbox

import (
	"errors"
	"io"
	"sync"

	"github.com/pulse-agent/pulse/backend"
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
	// writing: forward is in the caller's Write; splicing: ReadOutputFrom
	// is moving bytes to the caller's file itself, which neither may do
	// while the other does, nor before what is queued has gone.
	writing, splicing bool
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
	if err := o.waitRoom(len(p)); err != nil {
		return 0, err
	}
	o.buf = append(o.buf, p...)
	o.cond.Broadcast()
	return len(p), nil
}

// waitRoom waits, with o.mu held, until n more bytes may be queued, and
// returns why nothing more may be, if so. One write larger than the
// queue still goes in whole when the queue is empty, so it cannot wait
// forever for room.
func (o *outWriter) waitRoom(n int) error {
	for len(o.buf) > 0 && len(o.buf)+n > outQueueBytes && !o.abandoned && o.err == nil {
		o.cond.Wait()
	}
	return o.stopped()
}

// stopped is why nothing more may be written (o.mu held), or nil.
func (o *outWriter) stopped() error {
	switch {
	case o.abandoned:
		return errWriterAbandoned
	case o.err != nil:
		return o.err
	case o.closed:
		return io.ErrClosedPipe
	}
	return nil
}

func (o *outWriter) forward() {
	defer close(o.done)
	for {
		o.mu.Lock()
		for (len(o.buf) == 0 && !o.closed || o.splicing) && !o.abandoned {
			o.cond.Wait()
		}
		if o.abandoned || len(o.buf) == 0 {
			o.mu.Unlock()
			return
		}
		chunk := o.buf
		o.buf, o.spare = o.spare[:0], nil
		o.writing = true
		o.mu.Unlock()

		n, err := o.w.Write(chunk)
		if err == nil && n < len(chunk) {
			err = io.ErrShortWrite
		}
		o.mu.Lock()
		o.writing = false
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

// ReadOutputFrom takes a command's output from its source (a backend's
// copy of it, backend.OutputReader) until the source ends, with the
// promises of Write: in order after what was queued before, never more
// than the queue's bound ahead of the caller's writer, and failing at
// once when that writer was given up on. Where the source is a pipe and
// the caller's writer a file, the bytes go from one to the other inside
// the kernel (splice, splice_linux.go), this goroutine waiting for the
// file as forward would; otherwise they are read straight into the
// queue's buffers, which are handed to forward whole instead of copied.
func (o *outWriter) ReadOutputFrom(r io.Reader) (int64, error) {
	n, err, spliced := o.splice(r)
	if spliced {
		return n, err
	}
	m, err := o.readInto(r)
	return n + m, err
}

// readInto reads r into buffers of its own and queues each, by handing it
// over when the queue is empty (forward takes it as it is) or by
// appending it to what is queued (forward is behind: the copy is what
// Write would have made).
//
// As the splice does, it waits for the command's next write in poll(2)
// for a moment before the netpoller does (backend.WaitReadable), and once the
// stream is a bulk one, with its pipe grown, naps after a read that
// brought less than a quarter of the pipe, so that the next brings a
// batch: fewer wake-ups of this goroutine, of forward and of the caller's
// writer.
func (o *outWriter) readInto(r io.Reader) (int64, error) {
	rb := o.takeBuffer()
	var total int64
	bulk := false
	for {
		if total > 0 {
			backend.WaitReadable(r)
		}
		n, err := r.Read(rb[:cap(rb)])
		if n > 0 {
			if total < backend.BulkAfter && total+int64(n) >= backend.BulkAfter {
				bulk = backend.GrowBulk(r)
			}
			var qerr error
			if rb, qerr = o.queue(rb[:n]); qerr != nil {
				return total, qerr
			}
			total += int64(n)
			if bulk && n < backend.BulkPipe/4 {
				backend.Nap()
			}
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// takeBuffer is a buffer for readInto: the queue's empty one when it has
// room (forward's spare from its last turn), else a new one.
func (o *outWriter) takeBuffer() []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.buf) == 0 && cap(o.buf) >= backend.OutputChunk {
		b := o.buf[:0]
		o.buf = nil
		return b
	}
	return make([]byte, 0, backend.OutputChunk)
}

// queue queues p, which readInto read into a buffer of its own, as Write
// would, and returns the buffer to read into next.
func (o *outWriter) queue(p []byte) ([]byte, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.waitRoom(len(p)); err != nil {
		return p, err
	}
	o.cond.Broadcast()
	if len(o.buf) > 0 {
		o.buf = append(o.buf, p...)
		return p[:0], nil
	}
	next := o.buf[:0]
	o.buf = p
	if cap(next) < backend.OutputChunk {
		next = make([]byte, 0, backend.OutputChunk)
	}
	return next, nil
}

// beginSplice marks the caller's writer as being written by the splice
// when nothing queued is still on its way to it (busy otherwise: wait
// with waitQueued and try again); endSplice gives it back. The error is
// why nothing more may be written.
func (o *outWriter) beginSplice() (busy bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.stopped(); err != nil {
		return false, err
	}
	if len(o.buf) > 0 || o.writing {
		return true, nil
	}
	o.splicing = true
	return false, nil
}

// waitQueued waits until what is queued has reached the caller's writer,
// or until nothing more may be written.
func (o *outWriter) waitQueued() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for (len(o.buf) > 0 || o.writing) && o.stopped() == nil {
		o.cond.Wait()
	}
}

// Only forward waits for the splice to end, and only when there is
// something for it to do then (bytes queued meanwhile, or the end): the
// splice ends a turn hundreds of times a second in a bulk stream, and a
// broadcast wakes forward's goroutine each time to find nothing.
func (o *outWriter) endSplice() {
	o.mu.Lock()
	o.splicing = false
	if len(o.buf) > 0 || o.closed || o.abandoned {
		o.cond.Broadcast()
	}
	o.mu.Unlock()
}

func (o *outWriter) isAbandoned() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.abandoned
}
