package sandbox

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// recvWriter keeps what it is given, sometimes slowly, and checks that a
// buffer it was handed is not changed under it while it reads it.
type recvWriter struct {
	mu  sync.Mutex
	got bytes.Buffer
	r   *rand.Rand
	bad bool
}

func (w *recvWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := bytes.Clone(p)
	if w.r.Intn(4) == 0 {
		time.Sleep(50 * time.Microsecond) // let the queue fill meanwhile
	}
	if !bytes.Equal(before, p) {
		w.bad = true
	}
	w.got.Write(p)
	return len(p), nil
}

// TestOutWriterKeepsOrder: what is written reaches the caller's writer
// whole and in order while the queue's two buffers take turns, and no
// buffer is refilled while the caller's writer holds it.
func TestOutWriterKeepsOrder(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	dst := &recvWriter{r: rand.New(rand.NewSource(4))}
	q := newOutWriter(dst)
	var want bytes.Buffer
	for i := 0; i < 500; i++ {
		p := make([]byte, 1+r.Intn(16<<10))
		r.Read(p)
		want.Write(p)
		if _, err := q.Write(p); err != nil {
			t.Fatal(err)
		}
		clear(p) // the queue must have copied it
	}
	closeAndCheck(t, q, dst, want.Bytes())
}

// closeAndCheck closes q and checks that dst got want, with no buffer
// changed under it.
func closeAndCheck(t *testing.T, q *outWriter, dst *recvWriter, want []byte) {
	t.Helper()
	if err := q.close(make(chan struct{})); err != nil {
		t.Fatal(err)
	}
	if dst.bad {
		t.Error("a buffer changed while the caller's writer held it")
	}
	if !bytes.Equal(dst.got.Bytes(), want) {
		t.Fatalf("caller got %d bytes, differing from the %d written", dst.got.Len(), len(want))
	}
}

// TestOutWriterReadOutputFromKeepsOrder: output taken from its source
// (ReadOutputFrom, as a backend's copy hands it over) reaches the
// caller's writer whole and in order after what was written before it,
// with no buffer refilled while the caller's writer holds it, for a
// source that is a pipe and one that is not.
func TestOutWriterReadOutputFromKeepsOrder(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		r := rand.New(rand.NewSource(5))
		dst := &recvWriter{r: rand.New(rand.NewSource(6))}
		q := newOutWriter(dst)
		var want bytes.Buffer
		for range 20 {
			p := make([]byte, 1+r.Intn(16<<10))
			r.Read(p)
			want.Write(p)
			if _, err := q.Write(p); err != nil {
				t.Fatal(err)
			}
			data := make([]byte, r.Intn(1<<20))
			r.Read(data)
			want.Write(data)
			var src io.Reader = bytes.NewReader(data)
			if pipe {
				pr, pw, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				go func() { pw.Write(data); pw.Close() }()
				defer pr.Close()
				src = pr
			}
			n, err := q.ReadOutputFrom(&backend.OutputSource{R: src, N: int64(len(data))})
			if err != nil || n != int64(len(data)) {
				t.Fatalf("ReadOutputFrom: %d of %d bytes, %v", n, len(data), err)
			}
		}
		closeAndCheck(t, q, dst, want.Bytes())
	}
}

// TestOutWriterReadOutputFromAbandoned: a ReadOutputFrom held up by a
// caller's writer that never returns ends with errWriterAbandoned once the
// writer is given up on.
func TestOutWriterReadOutputFromAbandoned(t *testing.T) {
	w := &enteredWriter{entered: make(chan struct{}), release: make(chan struct{})}
	defer close(w.release)
	q := newOutWriter(w)
	done := make(chan error, 1)
	go func() {
		_, err := q.ReadOutputFrom(&backend.OutputSource{R: zeroReader{}, N: 64 << 20})
		done <- err
	}()
	<-w.entered
	// Giving up, as outputs does once ctx has ended and the grace period
	// passed: the queues are abandoned, then giveUp closed.
	q.abandon()
	giveUp := make(chan struct{})
	close(giveUp)
	q.close(giveUp)
	select {
	case err := <-done:
		if !errors.Is(err, errWriterAbandoned) {
			t.Fatalf("ReadOutputFrom after abandon: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ReadOutputFrom hangs after its writer was abandoned")
	}
}

// enteredWriter blocks every Write until release, and closes entered at
// the first.
type enteredWriter struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (w *enteredWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	return len(p), nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
