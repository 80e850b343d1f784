package server

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// TestStdinFeed: what a process reads is every byte once, in order, however
// the requests overlap; an offset past what was received, data after EOF
// and a second writer while one waits are refused.
func TestStdinFeed(t *testing.T) {
	pr, pw := io.Pipe()
	f := &stdinFeed{w: pw}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(pr)
		got <- b
	}()
	for i, tc := range []struct {
		off      int64
		data     string
		eof      bool
		received int64
		err      error
	}{
		{0, "abc", false, 3, nil},
		{0, "abc", false, 3, nil}, // sent again after a lost connection
		{2, "cde", false, 5, nil}, // overlaps: only "de" is new
		{7, "x", false, 5, protocol.ErrInvalid},
		{5, "", true, 5, nil},   // end of input
		{3, "de", true, 5, nil}, // the end sent again
		{5, "x", false, 5, errStdinClosed},
	} {
		n, err := f.write(&protocol.StdinRequest{ExecutionID: "e", Offset: tc.off, Data: []byte(tc.data), EOF: tc.eof})
		if n != tc.received || (tc.err == nil) != (err == nil) || tc.err != nil && !errors.Is(err, tc.err) {
			t.Errorf("%d: write(%d, %q, eof %v) = %d, %v; want %d, %v", i, tc.off, tc.data, tc.eof, n, err, tc.received, tc.err)
		}
	}
	if b := <-got; string(b) != "abcde" {
		t.Errorf("the process read %q, want abcde", b)
	}

	// A writer waiting for a command that does not read holds the feed;
	// another is refused, and the end of the command frees the first.
	pr2, pw2 := io.Pipe()
	f2 := &stdinFeed{w: pw2}
	first := make(chan error, 1)
	launch := func() {
		go func() {
			_, err := f2.write(&protocol.StdinRequest{ExecutionID: "e", Data: []byte("never read")})
			first <- err
		}()
	}
	launch()
	// Wait until the first writer holds the feed (it then stays blocked
	// in the pipe): a TryLock that fails says so.
	for f2.busy.TryLock() {
		f2.busy.Unlock()
		select {
		case err := <-first:
			if !errors.Is(err, errStdinBusy) { // not only this loop's TryLock in its way
				t.Fatalf("the first writer returned %v before the command ended", err)
			}
			launch()
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := f2.write(&protocol.StdinRequest{ExecutionID: "e", Data: []byte("x")}); !errors.Is(err, errStdinBusy) {
		t.Fatalf("a second writer = %v, want errStdinBusy", err)
	}
	pr2.CloseWithError(backend.ErrProcessDone)
	if err := <-first; !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("a write cut by the command's end = %v, want ErrProcessDone", err)
	}
}
