package sandbox

import (
	"bytes"
	"io"
	"math/rand"
	"os"
	"testing"

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
	go func() {
		r := rand.New(rand.NewSource(8))
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+r.Intn(200<<10))
			if _, err := inW.Write(rest[:n]); err != nil {
				break
			}
			rest = rest[n:]
		}
		inW.Close()
	}()
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
