package backend

import (
	"errors"
	"io"
	"sync"
	"time"
)

// OutputChunk is the most ReadOutput reads at once, and what it grows a
// pipe it reads to.
const OutputChunk = 256 << 10

// BulkPipe is what a pipe carrying a bulk stream is grown to, once
// BulkAfter bytes have passed through it (GrowBulk). A command streaming
// faster than it is read then runs that much ahead, and each wake-up of
// the reader and of the process after it moves that much more: at stream
// rates the wake-ups, not the bytes, are what a pipe costs (on a virtual
// machine more so, each syscall and task switch a hypervisor exit). Only
// bulk streams are grown that far, so that the many short ones do not
// use up the user's pipe allowance (pipe-user-pages-soft), past which
// every new pipe of that user gets a mere two pages.
const (
	BulkPipe  = 1 << 20
	BulkAfter = 1 << 20
)

// StreamWait is how long a copy of a command's output waits in poll(2)
// for the command's next write before it leaves the wait to the
// netpoller (PollReadable). BulkNap is how long the copy of a bulk stream
// sleeps after a read that brought less than a quarter of its grown pipe
// (Nap): far less than that pipe takes to fill at memory speed, so that
// the command does not stall on it, and no byte is delayed by more.
const (
	StreamWait = 10 * time.Millisecond
	BulkNap    = 300 * time.Microsecond
)

var outputBufs = sync.Pool{New: func() any { b := make([]byte, OutputChunk); return &b }}

// ReadOutput copies r to w until r ends, as io.Copy does, for a backend's
// copy of a command's stdout or stderr. It reads up to OutputChunk at a
// time (io.Copy reads 32 KiB), and when r is a pipe it first grows the
// pipe's buffer to OutputChunk (best effort), so that a command writing
// faster than the caller consumes runs ahead by that much and is then
// read in few large chunks: at stream rates each read is a wake-up of the
// copying goroutine and of everything after it (the output cap, the
// secret scrubber, the caller's writer), and those wake-ups, not the
// bytes, are what the copy costs. For the same reason it waits for the
// command's next write in poll(2) a moment before the netpoller does
// (WaitReadable), and a bulk stream, past BulkAfter with its pipe grown
// to BulkPipe, naps after a read that brought less than a quarter of the
// pipe (Nap), so that the next brings a batch. Every byte read is passed
// to w, in order; a read error other than io.EOF is returned, as is w's.
func ReadOutput(w io.Writer, r io.Reader) (int64, error) {
	GrowPipe(r)
	bp := outputBufs.Get().(*[]byte)
	defer outputBufs.Put(bp)
	buf := *bp
	var total int64
	bulk := false
	for {
		if total > 0 {
			WaitReadable(r)
		}
		n, err := r.Read(buf)
		if n > 0 {
			if total < BulkAfter && total+int64(n) >= BulkAfter {
				bulk = GrowBulk(r)
			}
			m, werr := w.Write(buf[:n])
			total += int64(m)
			if werr == nil && m < n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return total, werr
			}
			if bulk && n < BulkPipe/4 && err == nil {
				Nap()
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

// OutputReader is an optional interface of a Request's Stdout and Stderr: a
// writer that can take a command's output from its source itself. A
// backend's copy of a command's output hands it an *OutputSource and
// ReadOutputFrom reads it until it ends (nil, as io.ReaderFrom reports
// io.EOF) or until it can pass nothing more on (its error). A writer that
// hands the bytes to a goroutine of its own reads them straight into its
// queue's buffers rather than being given a copy, and one that ends in a
// file may move them from pipe to file without them passing through this
// process at all (splice(2)): per chunk, that is a copy and a wake-up less.
//
// Only writers that can keep every promise of Write do it: the sandbox's
// queue for a caller's writer, through a secret scrubber that has nothing
// to redact. A scrubbing writer does not.
type OutputReader interface {
	ReadOutputFrom(r io.Reader) (int64, error)
}

// OutputSource is what a backend hands an OutputReader: R, of which at most
// N more bytes may be read (a backend's output cap), remembering R's own
// error so that the backend tells it apart from the writer's. Stopped,
// when set, ends the source (io.EOF) once it returns true, and what a read
// brought back after that is dropped: a backend whose Exec has returned
// lets nothing more through.
type OutputSource struct {
	R       io.Reader
	N       int64
	Err     error
	Stopped func() bool
}

// Read reads from R, at most N bytes in all.
func (s *OutputSource) Read(p []byte) (int, error) {
	if s.N <= 0 || s.IsStopped() {
		return 0, io.EOF
	}
	if int64(len(p)) > s.N {
		p = p[:s.N]
	}
	n, err := s.R.Read(p)
	s.N -= int64(n)
	if n > 0 && s.IsStopped() {
		return 0, io.EOF
	}
	if err != nil && !errors.Is(err, io.EOF) {
		s.Err = err
	}
	return n, err
}

// Spliced accounts for n bytes moved out of R by other means than Read (a
// splice from R's pipe), and for R's error when err is not nil.
func (s *OutputSource) Spliced(n int64, err error) {
	s.N -= n
	if err != nil && !errors.Is(err, io.EOF) {
		s.Err = err
	}
}

// IsStopped reports whether the source was ended by its backend.
func (s *OutputSource) IsStopped() bool { return s.Stopped != nil && s.Stopped() }

// PassOutput lets w, when it is an OutputReader, take up to limit bytes of
// r itself, and reports how many were read from r, r's error and w's
// error apart. It does nothing when w is not an OutputReader (ok false);
// the caller then copies with ReadOutput. After it, the caller goes on
// draining r as its cap (limit reached) or w's failure asks.
func PassOutput(w io.Writer, r io.Reader, limit int64, stopped func() bool) (read int64, rerr, werr error, ok bool) {
	or, ok := w.(OutputReader)
	if !ok || limit <= 0 {
		return 0, nil, nil, false
	}
	src := &OutputSource{R: r, N: limit, Stopped: stopped}
	_, err := or.ReadOutputFrom(src)
	read = limit - src.N
	if src.Err != nil {
		return read, src.Err, nil, true
	}
	return read, nil, err, true
}
