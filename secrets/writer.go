package secrets

import (
	"io"
	"sync"
)

// stage is one pass of redaction: a finder of leftmost-longest matches whose
// decision for a match starting at s depends only on t[s:s+window].
type stage interface {
	find(t []byte, from int) (start, end int, rep []byte)
	window() int
}

type literalStage struct {
	m    *matcher
	reps [][]byte
}

func (l literalStage) find(t []byte, from int) (int, int, []byte) {
	s, e, p := l.m.next(t, from)
	if s < 0 {
		return -1, -1, nil
	}
	return s, e, l.reps[p]
}

func (l literalStage) window() int { return l.m.maxLen }

type detectorStage struct{ d *detectorSet }

func (d detectorStage) find(t []byte, from int) (int, int, []byte) { return d.d.next(t, from) }
func (d detectorStage) window() int                                { return d.d.maxLen }

// NewWriter returns a writer that redacts what is written to it and passes
// the result to w. A secret split across any number of Write calls is still
// redacted: the writer keeps back at most HoldBack() bytes (Longest()-1
// without detectors) that might begin a secret, and writes them on Close.
// The output equals Redact of everything written, whatever the chunking.
//
// Write reports len(p) once p is accepted; an error from w is returned and
// is sticky. Close flushes and is idempotent; it does not close w. Write
// after Close returns ErrClosed. Write and Close may be called from
// different goroutines (a straggling output copier and the code that ends
// the command); they are serialised.
func (s *Scrubber) NewWriter(w io.Writer) io.WriteCloser {
	if s.none() || s.lit.maxLen == 0 && s.det == nil {
		if or, ok := w.(outputReader); ok {
			return &passReader{passWriter{w: w}, or}
		}
		return &passWriter{w: w}
	}
	var next io.Writer = w
	var inner *stageWriter
	if s.det != nil {
		inner = &stageWriter{st: detectorStage{s.det}, w: w}
		next = inner
	}
	if s.lit.maxLen == 0 {
		return inner
	}
	return &stageWriter{st: literalStage{s.lit, s.reps}, w: next, chain: inner}
}

type stageWriter struct {
	mu     sync.Mutex
	st     stage
	w      io.Writer
	chain  *stageWriter // closed after this one has flushed into it
	buf    []byte
	out    []byte
	err    error
	closed bool
}

func (x *stageWriter) Write(p []byte) (int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return 0, ErrClosed
	}
	if x.err != nil {
		return 0, x.err
	}
	n := len(p)
	win := x.st.window()
	if len(x.buf)+len(p) <= 4*win {
		x.buf = append(x.buf, p...)
		if err := x.process(false); err != nil {
			x.err = err
			return 0, err
		}
		return n, nil
	}
	// A large write is scanned where it lies instead of being copied
	// behind the held-back bytes: first the seam (held bytes plus the
	// first 2*win of p, enough that everything held is decided), then
	// the rest of p in place.
	if held := len(x.buf); held > 0 {
		x.buf = append(x.buf, p[:2*win]...)
		emit, err := x.scan(x.buf, false)
		if err != nil {
			x.err = err
			return 0, err
		}
		// emit >= len(buf)-win+1 > held: the seam is behind us.
		p = p[emit-held:]
		x.buf = x.buf[:0]
	}
	emit, err := x.scan(p, false)
	if err != nil {
		x.err = err
		return 0, err
	}
	x.buf = append(x.buf[:0], p[emit:]...)
	return n, nil
}

// Close writes what was held back and closes the chained stage.
func (x *stageWriter) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	err := x.err
	if err == nil {
		err = x.process(true)
	}
	if x.chain != nil {
		if cerr := x.chain.Close(); err == nil {
			err = cerr
		}
	}
	x.buf = nil
	x.out = nil
	return err
}

// process scans the held buffer and keeps what is still undecided.
func (x *stageWriter) process(final bool) error {
	emit, err := x.scan(x.buf, final)
	x.buf = x.buf[:copy(x.buf, x.buf[emit:])]
	return err
}

// directWrite is the size from which a plain run of text is written
// straight from the input rather than copied into the output buffer.
const directWrite = 16 << 10

// scan writes the redacted form of the decided prefix of t and returns its
// length. Undecided means: a match, or a longer or earlier one, could
// still be completed by bytes not yet written.
func (x *stageWriter) scan(t []byte, final bool) (int, error) {
	n := len(t)
	win := x.st.window()
	pos := 0
	x.out = x.out[:0]
	var err error
	plain := func(seg []byte) {
		if err != nil || len(seg) == 0 {
			return
		}
		if len(seg) < directWrite {
			x.out = append(x.out, seg...)
			return
		}
		if len(x.out) > 0 {
			if _, err = x.w.Write(x.out); err != nil {
				return
			}
			x.out = x.out[:0]
		}
		_, err = x.w.Write(seg)
	}
	for {
		s, e, rep := x.st.find(t, pos)
		if s < 0 || !final && s+win > n {
			break
		}
		plain(t[pos:s])
		x.out = append(x.out, rep...)
		pos = e
	}
	emit := n
	if !final {
		emit = max(min(n-(win-1), n), pos)
	}
	plain(t[pos:emit])
	if err == nil && len(x.out) > 0 {
		_, err = x.w.Write(x.out)
	}
	x.out = x.out[:0]
	return emit, err
}

type passWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (p *passWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	return p.w.Write(b)
}

func (p *passWriter) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// outputReader is backend.OutputReader (which this package cannot import):
// a writer that takes a command's output from its source itself.
type outputReader interface {
	ReadOutputFrom(r io.Reader) (int64, error)
}

// passReader is a passWriter over a writer that can take output from its
// source itself: with nothing to redact, every byte may go to it
// unchanged, so it is handed the source rather than copies of it (for a
// backend's output copy, no copy through this process's memory at all
// where w moves it from pipe to pipe). Close ends later Writes and
// ReadOutputFroms; one already running is ended by w's own close.
type passReader struct {
	passWriter
	or outputReader
}

func (p *passReader) ReadOutputFrom(r io.Reader) (int64, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	return p.or.ReadOutputFrom(r)
}
