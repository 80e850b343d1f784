package sandbox

import (
	"bytes"
	"math/rand"
	"sync"
	"testing"
	"time"
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
	if err := q.close(make(chan struct{})); err != nil {
		t.Fatal(err)
	}
	if dst.bad {
		t.Error("a buffer changed while the caller's writer held it")
	}
	if !bytes.Equal(dst.got.Bytes(), want.Bytes()) {
		t.Fatalf("caller got %d bytes, differing from the %d written", dst.got.Len(), want.Len())
	}
}
