package secrets

import "io"

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
// after Close returns ErrClosed. The writer is not safe for concurrent use.
func (s *Scrubber) NewWriter(w io.Writer) io.WriteCloser {
	if s == nil || s.lit.maxLen == 0 && s.det == nil {
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
	st     stage
	w      io.Writer
	chain  *stageWriter // closed after this one has flushed into it
	buf    []byte
	out    []byte
	err    error
	closed bool
}

func (x *stageWriter) Write(p []byte) (int, error) {
	if x.closed {
		return 0, ErrClosed
	}
	if x.err != nil {
		return 0, x.err
	}
	x.buf = append(x.buf, p...)
	if err := x.process(false); err != nil {
		x.err = err
		return 0, err
	}
	return len(p), nil
}

// Close writes what was held back and closes the chained stage.
func (x *stageWriter) Close() error {
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

func (x *stageWriter) process(final bool) error {
	n := len(x.buf)
	win := x.st.window()
	pos := 0
	x.out = x.out[:0]
	for {
		s, e, rep := x.st.find(x.buf, pos)
		// Undecided: a longer match, or one starting earlier, may still
		// arrive with the next bytes.
		if s < 0 || !final && s+win > n {
			break
		}
		x.out = append(x.out, x.buf[pos:s]...)
		x.out = append(x.out, rep...)
		pos = e
	}
	emit := n
	if !final {
		emit = n - (win - 1)
		if emit > n {
			emit = n
		}
		if emit < pos {
			emit = pos
		}
	}
	var err error
	if len(x.out) == 0 {
		if emit > 0 {
			_, err = x.w.Write(x.buf[:emit])
		}
	} else {
		x.out = append(x.out, x.buf[pos:emit]...)
		_, err = x.w.Write(x.out)
	}
	x.buf = x.buf[:copy(x.buf, x.buf[emit:])]
	return err
}

type passWriter struct {
	w      io.Writer
	closed bool
}

func (p *passWriter) Write(b []byte) (int, error) {
	if p.closed {
		return 0, ErrClosed
	}
	return p.w.Write(b)
}

func (p *passWriter) Close() error { p.closed = true; return nil }
