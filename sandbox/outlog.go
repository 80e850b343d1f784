package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// outputLog keeps what a background process printed, stdout and stderr
// as they arrived, so that any number of readers can read it from any
// byte offset, while it runs and after. It is a temporary file removed
// from its directory as soon as it is made: the bytes live as long as
// the descriptor (until the sandbox closes) and nothing is left on disk
// by a crash. It is bounded: the command's output cap already ends a
// process that prints more than output_bytes on either stream, and the
// log stops at twice that (Truncated) whatever happens.
type outputLog struct {
	mu    sync.Mutex
	cond  *sync.Cond
	f     *os.File
	size  int64
	limit int64
	// truncated: a write went past limit and was dropped. ended: no more
	// writes come; readers at the end get io.EOF. closed: the file is
	// gone, reads fail.
	truncated, ended, closed bool
	err                      error // a failed write to the file
}

// errLogClosed is what reading a process's output returns once the
// sandbox has closed.
var errLogClosed = errors.New("sandbox: process output is gone (the sandbox was closed)")

func newOutputLog(limit int64) (*outputLog, error) {
	f, err := os.CreateTemp("", "pulse-output-*")
	if err != nil {
		return nil, fmt.Errorf("sandbox: process output log: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: process output log: %w", err)
	}
	l := &outputLog{f: f, limit: limit}
	l.cond = sync.NewCond(&l.mu)
	return l, nil
}

// Write appends p; it never blocks on readers, and it never fails the
// command: what does not fit is dropped and noted.
func (l *outputLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.closed || l.err != nil {
		return len(p), nil
	}
	q := p
	if room := l.limit - l.size; int64(len(q)) > room {
		q, l.truncated = q[:max(room, 0)], true
	}
	if len(q) > 0 {
		n, err := l.f.WriteAt(q, l.size)
		l.size += int64(n)
		if err != nil {
			l.err = err
		}
		l.cond.Broadcast()
	}
	return len(p), nil
}

// end says no more writes come.
func (l *outputLog) end() {
	l.mu.Lock()
	l.ended = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// close drops the bytes; readers get errLogClosed.
func (l *outputLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed, l.ended = true, true
	l.f.Close()
	l.cond.Broadcast()
}

// Size is how many bytes the log holds.
func (l *outputLog) Size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size
}

// snapshot returns the bytes from off to the log's end as it stands,
// without waiting, and whether the log has ended (no byte comes after
// what it returned). The copy is taken under the lock, so a close that
// races it cannot hand back a torn read.
func (l *outputLog) snapshot(off int64) ([]byte, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, true, errLogClosed
	}
	off = max(off, 0)
	if off >= l.size {
		if l.err != nil {
			return nil, l.ended, fmt.Errorf("sandbox: process output log: %w", l.err)
		}
		return nil, l.ended, nil
	}
	buf := make([]byte, l.size-off)
	n, err := l.f.ReadAt(buf, off)
	if err != nil && !(err == io.EOF && int64(n) == l.size-off) {
		return buf[:n], false, fmt.Errorf("sandbox: process output log: %w", err)
	}
	return buf, l.ended, nil
}

// reader reads the log from off, waiting for more until the log ends.
func (l *outputLog) reader(off int64) *logReader {
	return &logReader{l: l, off: max(off, 0)}
}

// logReader is one reader of an outputLog. Its Close wakes a Read that
// waits.
type logReader struct {
	l      *outputLog
	off    int64
	closed bool // under l.mu
}

func (r *logReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	l := r.l
	l.mu.Lock()
	for !r.closed && !l.closed && r.off >= l.size && !l.ended {
		l.cond.Wait()
	}
	switch {
	case r.closed:
		l.mu.Unlock()
		return 0, io.ErrClosedPipe
	case l.closed:
		l.mu.Unlock()
		return 0, errLogClosed
	case r.off >= l.size:
		err := l.err
		l.mu.Unlock()
		if err != nil {
			return 0, fmt.Errorf("sandbox: process output log: %w", err)
		}
		return 0, io.EOF
	}
	n := min(int64(len(p)), l.size-r.off)
	// The file is only ever appended to past size, so the bytes below it
	// can be read without the lock; holding it keeps close from racing.
	m, err := l.f.ReadAt(p[:n], r.off)
	l.mu.Unlock()
	r.off += int64(m)
	if err == io.EOF && m > 0 {
		err = nil
	}
	return m, err
}

func (r *logReader) Close() error {
	r.l.mu.Lock()
	r.closed = true
	r.l.cond.Broadcast()
	r.l.mu.Unlock()
	return nil
}
