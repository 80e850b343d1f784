package sandbox

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// TestOutWriterSplicesPipeToFile: from a pipe to a caller's file in
// blocking mode the bytes go by splice (none through the queue), up to
// the source's limit and in order after what was queued before, both
// pipes grown once the stream is a bulk one; to a
// non-blocking one (whose write deadline a splice would bypass) they do
// not.
func TestOutWriterSplicesPipeToFile(t *testing.T) {
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inR.Close()
	outR, outW := blockingPipe(t)
	defer outR.Close()
	data := make([]byte, 3<<20+17)
	rand.New(rand.NewSource(7)).Read(data)
	go writeInChunks(inW, data, 8, 200<<10)
	var got bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&got, outR); close(copied) }()

	q := newOutWriter(outW)
	prefix := []byte("queued first\n")
	if _, err := q.Write(prefix); err != nil {
		t.Fatal(err)
	}
	const limit = 2<<20 + 5
	src := &backend.OutputSource{R: inR, N: limit}
	n, err, handled := q.splice(src)
	if err != nil || !handled || n != limit || src.N != 0 {
		t.Fatalf("splice: %d bytes, %v, handled %v, %d left", n, err, handled, src.N)
	}
	// Past backend.BulkAfter both pipes were grown for the bulk stream,
	// and the cap still held exactly.
	for _, f := range []*os.File{inR, outW} {
		if sz, err := pipeSize(f); err != nil || sz < backend.BulkPipe {
			t.Errorf("%s: pipe holds %d bytes (%v), want at least %d", f.Name(), sz, err, backend.BulkPipe)
		}
	}
	if err := q.close(make(chan struct{})); err != nil {
		t.Fatal(err)
	}
	outW.Close()
	<-copied
	if want := append(prefix, data[:limit]...); !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("file got %d bytes, want %d, the queued ones first", got.Len(), len(want))
	}

	nbR, nbW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer nbR.Close()
	defer nbW.Close()
	nq := newOutWriter(nbW)
	defer nq.close(make(chan struct{}))
	if _, _, handled := nq.splice(&backend.OutputSource{R: inR, N: 1}); handled {
		t.Error("spliced into a non-blocking file")
	}
}

// pipeSize is f's pipe buffer, read without f.Fd (which would put a
// non-blocking file into blocking mode).
func pipeSize(f *os.File) (sz int, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	if cerr := rc.Control(func(fd uintptr) { sz, err = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) }); cerr != nil {
		return 0, cerr
	}
	return sz, err
}

// TestOutWriterReadOutputFromBulk: a bulk stream read into the queue's
// buffers (the caller's writer is no file) grows its pipe once past
// backend.BulkAfter, and still reaches the caller's writer whole, in
// order after what was queued before, and cut exactly at the source's
// limit (the backend's output cap).
func TestOutWriterReadOutputFromBulk(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	data := make([]byte, 3<<20+17)
	rand.New(rand.NewSource(9)).Read(data)
	go writeInChunks(pw, data, 10, 64<<10)
	dst := &recvWriter{r: rand.New(rand.NewSource(11))}
	q := newOutWriter(dst)
	prefix := []byte("queued first\n")
	if _, err := q.Write(prefix); err != nil {
		t.Fatal(err)
	}
	const limit = 2<<20 + 5
	src := &backend.OutputSource{R: pr, N: limit}
	if n, err := q.ReadOutputFrom(src); err != nil || n != limit || src.N != 0 {
		t.Fatalf("ReadOutputFrom: %d bytes, %v, %d left", n, err, src.N)
	}
	if sz, err := pipeSize(pr); err != nil || sz < backend.BulkPipe {
		t.Errorf("pipe holds %d bytes (%v), want at least %d", sz, err, backend.BulkPipe)
	}
	closeAndCheck(t, q, dst, append(prefix, data[:limit]...))
}

// writeInChunks writes data to w in writes of assorted sizes up to most,
// as a command makes them, and closes w.
func writeInChunks(w *os.File, data []byte, seed int64, most int) {
	r := rand.New(rand.NewSource(seed))
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 1+r.Intn(most))
		if _, err := w.Write(rest[:n]); err != nil {
			break
		}
		rest = rest[n:]
	}
	w.Close()
}

// TestOutWriterSpliceStopsAtAbandon: once the caller's writer is given up
// on, the splice moves nothing more to it, though it was waiting in
// poll(2) for the command's next write when that happened (it waits there
// up to spliceStreamWait after each turn that moved bytes). Each attempt
// gives up on the writer while the splice waits, then writes again.
func TestOutWriterSpliceStopsAtAbandon(t *testing.T) {
	for attempt := range 10 {
		inR, inW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		outR, outW := blockingPipe(t)
		q := newOutWriter(outW)
		spliced := make(chan error, 1)
		go func() {
			_, err, _ := q.splice(&backend.OutputSource{R: inR, N: 1 << 20})
			spliced <- err
		}()
		if _, err := inW.Write([]byte("first")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(outR, make([]byte, len("first"))); err != nil {
			t.Fatal(err)
		}
		// The splice's next turn is waiting for more in poll(2), most
		// likely (a turn that has not reached its wait yet, or one that
		// has left it, sees the abandon before it moves anything).
		time.Sleep(time.Millisecond)
		q.abandon()
		if _, err := inW.Write([]byte("late")); err != nil {
			t.Fatal(err)
		}
		if err := <-spliced; !errors.Is(err, errWriterAbandoned) {
			t.Fatalf("attempt %d: splice after abandon: %v", attempt, err)
		}
		outW.Close()
		late, _ := io.ReadAll(outR)
		inW.Close()
		inR.Close()
		outR.Close()
		if len(late) > 0 {
			t.Fatalf("attempt %d: %q reached the caller's file after it was given up on", attempt, late)
		}
	}
}
