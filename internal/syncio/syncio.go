// Package syncio holds the io.Writers that several goroutines may write to
// at once: a command's stdout and stderr are copied by two goroutines, and
// when both go to one writer (or one buffer) each Write must be whole.
// It is a leaf: it imports only the standard library, so public packages
// may use it.
package syncio

import (
	"bytes"
	"io"
	"sync"
)

// Writer serialises Writes to W. W is set once, before the first Write.
type Writer struct {
	mu sync.Mutex
	W  io.Writer
}

// Write writes p to W while no other Write of this Writer runs.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.W.Write(p)
}

// Buffer is a bytes.Buffer that may be written from several goroutines and
// read while they write. The zero value is an empty buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
