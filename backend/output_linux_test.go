package backend

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadOutput: every byte written to a pipe reaches the writer, in
// order, the pipe's buffer is grown (to BulkPipe, past BulkAfter), and the writer's
// error (or a short write) ends the copy with it.
func TestReadOutput(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	data := make([]byte, 5<<20+123)
	rand.New(rand.NewSource(1)).Read(data)
	go func() {
		// Writes of assorted sizes, as a command makes them.
		r := rand.New(rand.NewSource(2))
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+r.Intn(100<<10))
			if _, err := pw.Write(rest[:n]); err != nil {
				break
			}
			rest = rest[n:]
		}
		pw.Close()
	}()
	var out bytes.Buffer
	n, err := ReadOutput(&out, pr)
	if err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("ReadOutput: %d bytes, %v; equal %v", n, err, bytes.Equal(out.Bytes(), data))
	}
	if sz, err := unix.FcntlInt(pr.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || sz < BulkPipe {
		t.Errorf("pipe buffer %d bytes (%v) after %d bytes, want at least %d", sz, err, len(data), BulkPipe)
	}

	boom := errors.New("writer failed")
	if _, err := ReadOutput(errWriter{boom}, bytes.NewReader(data)); !errors.Is(err, boom) {
		t.Errorf("writer error: %v", err)
	}
	if _, err := ReadOutput(shortWriter{}, bytes.NewReader(data)); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("short write: %v", err)
	}
	readErr := errors.New("read failed")
	if _, err := ReadOutput(io.Discard, io.MultiReader(bytes.NewReader(data[:10]), errReader{readErr})); !errors.Is(err, readErr) {
		t.Errorf("read error: %v", err)
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// readFromWriter is a writer whose ReadFrom is ReadOutput, as the
// backends' output caps are.
type readFromWriter struct{ n int64 }

func (w *readFromWriter) Write(p []byte) (int, error)         { w.n += int64(len(p)); return len(p), nil }
func (w *readFromWriter) ReadFrom(r io.Reader) (int64, error) { return ReadOutput(w, r) }

// TestReadOutputThroughIOCopy: io.Copy from an *os.File pipe reaches
// ReadFrom (the file's WriteTo falls back to it), and the pipe is grown
// through the wrapper io.Copy passes.
func TestReadOutputThroughIOCopy(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	go func() { pw.Write(make([]byte, 1000)); pw.Close() }()
	w := &readFromWriter{}
	if n, err := io.Copy(w, pr); err != nil || n != 1000 || w.n != 1000 {
		t.Fatalf("io.Copy: %d (%d written), %v", n, w.n, err)
	}
	if sz, err := unix.FcntlInt(pr.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || sz < OutputChunk {
		t.Errorf("pipe buffer %d bytes (%v): ReadFrom not reached, or the pipe not grown", sz, err)
	}
}

// sourceWriter takes output from its source itself (an OutputReader),
// failing after fail bytes when fail is set.
type sourceWriter struct {
	bytes.Buffer
	fail int
}

var errSourceWriter = errors.New("writer failed")

func (w *sourceWriter) ReadOutputFrom(r io.Reader) (int64, error) {
	if w.fail > 0 {
		n, err := io.CopyN(&w.Buffer, r, int64(w.fail))
		if err == nil {
			err = errSourceWriter
		}
		return n, err
	}
	return w.ReadFrom(r)
}

// TestPassOutput: an OutputReader is handed the source up to the limit;
// the source's error and the writer's come back apart; a stopped source
// ends; a writer that is no OutputReader is left to ReadOutput.
func TestPassOutput(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 10_000)
	w := &sourceWriter{}
	read, rerr, werr, ok := PassOutput(w, bytes.NewReader(data), 12_345, nil)
	if !ok || rerr != nil || werr != nil || read != 12_345 || !bytes.Equal(w.Bytes(), data[:12_345]) {
		t.Fatalf("limited: %d bytes, %v, %v, %v", read, rerr, werr, ok)
	}
	readErr := errors.New("read failed")
	w = &sourceWriter{}
	_, rerr, werr, _ = PassOutput(w, io.MultiReader(bytes.NewReader(data[:10]), errReader{readErr}), 1<<20, nil)
	if !errors.Is(rerr, readErr) || werr != nil {
		t.Errorf("read error: %v, writer error %v", rerr, werr)
	}
	w = &sourceWriter{fail: 100}
	read, rerr, werr, _ = PassOutput(w, bytes.NewReader(data), 1<<20, nil)
	if rerr != nil || !errors.Is(werr, errSourceWriter) || read < 100 {
		t.Errorf("writer error: %d bytes, read error %v, writer error %v", read, rerr, werr)
	}
	w = &sourceWriter{}
	if read, _, _, _ = PassOutput(w, bytes.NewReader(data), 1<<20, func() bool { return true }); read != 0 || w.Len() != 0 {
		t.Errorf("a stopped source passed %d bytes", w.Len())
	}
	if _, _, _, ok := PassOutput(&bytes.Buffer{}, bytes.NewReader(data), 1<<20, nil); ok {
		t.Error("a writer that is no OutputReader was handed the source")
	}
}
