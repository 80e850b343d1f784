package backend

import (
	"errors"
	"io"
	"sync"
)

// OutputChunk is the most ReadOutput reads at once, and what it grows a
// pipe it reads to.
const OutputChunk = 256 << 10

var outputBufs = sync.Pool{New: func() any { b := make([]byte, OutputChunk); return &b }}

// ReadOutput copies r to w until r ends, as io.Copy does, for a backend's
// copy of a command's stdout or stderr. It reads up to OutputChunk at a
// time (io.Copy reads 32 KiB), and when r is a pipe it first grows the
// pipe's buffer to OutputChunk (best effort), so that a command writing
// faster than the caller consumes runs ahead by that much and is then
// read in few large chunks: at stream rates each read is a wake-up of the
// copying goroutine and of everything after it (the output cap, the
// secret scrubber, the caller's writer), and those wake-ups, not the
// bytes, are what the copy costs. Every byte read is passed to w, in
// order; a read error other than io.EOF is returned, as is w's.
func ReadOutput(w io.Writer, r io.Reader) (int64, error) {
	GrowPipe(r)
	bp := outputBufs.Get().(*[]byte)
	defer outputBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			total += int64(m)
			if werr == nil && m < n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return total, werr
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
