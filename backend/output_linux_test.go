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
// order, the pipe's buffer is grown to OutputChunk, and the writer's
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
	if sz, err := unix.FcntlInt(pr.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || sz < OutputChunk {
		t.Errorf("pipe buffer %d bytes (%v), want at least %d", sz, err, OutputChunk)
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
