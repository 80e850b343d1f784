package backend

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inEpollSet reports whether the pipe of fd is a target of any epoll set
// of this process (the runtime's netpoller among them), by any
// descriptor: /proc/self/fdinfo lists each target with its inode.
func inEpollSet(t *testing.T, fd uintptr) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		t.Fatal(err)
	}
	want := "ino:" + strconv.FormatUint(st.Ino, 16)
	infos, err := filepath.Glob("/proc/self/fdinfo/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range infos {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			// "tfd:        7 events:       19 data: ... ino:fc705f sdev:f"
			if f := strings.Fields(line); len(f) > 1 && f[0] == "tfd:" && slices.Contains(f, want) {
				return true
			}
		}
	}
	return false
}

func TestOutputPipeReadsToEOFOutsideTheNetpoller(t *testing.T) {
	// The check must be able to fail: an os.Pipe's read end is in the
	// runtime's epoll set.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if !inEpollSet(t, r.Fd()) {
		t.Skip("skipped: /proc/self/fdinfo does not list epoll targets here")
	}
	r.Close()
	w.Close()

	p, pw, err := NewOutputPipe("stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, more than the pipe holds
	go func() {
		for i := 0; i < len(want); i += 8 << 10 {
			pw.Write(want[i : i+8<<10])
			if i == 512<<10 {
				// Quiet for longer than a read waits in poll(2): the
				// reader parks.
				time.Sleep(3 * StreamWait)
			}
		}
		pw.Close()
	}()
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		if inEpollSet(t, p.Fd()) {
			t.Fatal("the output pipe's descriptor is in an epoll set between reads")
		}
		n, err := p.Read(buf)
		got.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("read %d bytes, not the %d written in order", got.Len(), len(want))
	}
}

func TestOutputPipeCloseEndsAParkedRead(t *testing.T) {
	p, pw, err := NewOutputPipe("stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close() // a writer that never writes nor leaves
	errc := make(chan error, 1)
	go func() {
		_, err := p.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a Read waiting for the command's next write")
	}
	if err := p.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second Close: %v, want os.ErrClosed", err)
	}
}

func TestOutputPipeRawConnWaitsForTheNextWrite(t *testing.T) {
	p, pw, err := NewOutputPipe("stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go func() {
		time.Sleep(3 * StreamWait)
		pw.Write([]byte("late"))
		pw.Close()
	}()
	rc, err := p.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	calls := 0
	err = rc.Read(func(fd uintptr) bool {
		calls++
		b := make([]byte, 16)
		n, err := unix.Read(int(fd), b)
		if errors.Is(err, unix.EAGAIN) {
			return false
		}
		got = b[:max(n, 0)]
		return true
	})
	if err != nil || string(got) != "late" {
		t.Fatalf("RawConn.Read: %q, %v; want \"late\"", got, err)
	}
	if calls != 2 {
		t.Fatalf("f called %d times, want 2 (once empty, once after the write)", calls)
	}
	if err := rc.Write(func(uintptr) bool { return true }); err == nil {
		t.Fatal("RawConn.Write of a read end succeeded")
	}
}

// BenchmarkOutputPipe streams 64 MiB in head's 8 KiB writes through a
// pipe that ReadOutput copies to io.Discard, read from an OutputPipe
// against the same from an os.Pipe (in the runtime's netpoller),
// alternately. x-vs-os-pipe is the ratio of their times.
func BenchmarkOutputPipe(b *testing.B) {
	const size, chunk = 64 << 20, 8 << 10
	stream := func(b *testing.B, r io.ReadCloser, w *os.File) time.Duration {
		t0 := time.Now()
		go func() {
			p := make([]byte, chunk)
			for i := 0; i < size; i += chunk {
				if _, err := w.Write(p); err != nil {
					break
				}
			}
			w.Close()
		}()
		n, err := ReadOutput(io.Discard, r)
		r.Close()
		if err != nil || n != size {
			b.Fatalf("copied %d bytes, %v", n, err)
		}
		return time.Since(t0)
	}
	var mine, ref time.Duration
	for b.Loop() {
		p, pw, err := NewOutputPipe("stdout")
		if err != nil {
			b.Fatal(err)
		}
		mine += stream(b, p, pw)
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		w.Fd() // the writer in blocking mode on both sides, as a command's stdout is
		ref += stream(b, r, w)
	}
	b.ReportMetric(float64(mine)/float64(ref), "x-vs-os-pipe")
	b.ReportMetric(float64(size)*float64(b.N)/mine.Seconds()/(1<<20), "MiB/s")
}
