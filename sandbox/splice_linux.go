package sandbox

import (
	"errors"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// spliceMax is the most one splice(2) is asked to move; a pipe holds less.
const spliceMax = 4 << 20

// spliceOutWait is how long one wait for room in the caller's file lasts
// before the queue looks again whether it was given up on.
const spliceOutWait = 100 // ms

// splice moves a backend's output from its pipe to the caller's file with
// splice(2): page references pass from the one pipe to the other (or the
// bytes into the file) without a copy through this process or a wake-up
// of forward. It applies when r is a backend.OutputSource reading an
// *os.File and the caller's writer is an *os.File in blocking mode, and keeps the queue's
// promises: it starts only once what was queued has been written, writes
// nothing after close or abandon, and waits for a full caller's file in
// bounded turns, so that abandon ends it. It reports handled false, having
// moved n bytes, when splice(2) cannot move these bytes (the file takes no
// splice, as a terminal; an error either side): the caller then goes on
// with a plain copy from where it stopped, which meets the same error, if
// any, in the ordinary way (a read error from the source, the caller's
// writer's from its Write).
func (o *outWriter) splice(r io.Reader) (n int64, err error, handled bool) {
	src, ok := r.(*backend.OutputSource)
	if !ok {
		return 0, nil, false
	}
	// The command's pipe, as an *os.File or (from io.Copy by way of
	// os.File.WriteTo) one wrapped.
	in, ok := src.R.(syscall.Conn)
	if !ok {
		return 0, nil, false
	}
	// Only a file in blocking mode, as a CLI's stdout is: the write
	// deadlines a connection or a non-blocking file (one of os.Pipe's)
	// may carry would be bypassed.
	out, ok := o.w.(*os.File)
	if !ok {
		return 0, nil, false
	}
	inRC, err := in.SyscallConn()
	if err != nil {
		return 0, nil, false
	}
	outRC, err := out.SyscallConn()
	if err != nil {
		return 0, nil, false
	}
	blocking := false
	if err := outRC.Control(func(fd uintptr) {
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		blocking = err == nil && fl&unix.O_NONBLOCK == 0
	}); err != nil || !blocking {
		return 0, nil, false
	}
	// pollFirst: the last turn moved bytes, so the next waits for more in
	// poll(2) before it splices (source empty otherwise: one splice the
	// less per turn). bulk: the stream passed BulkAfter and both pipes
	// now hold BulkPipe, so a turn that moved little naps before the
	// next (backend.Nap), for the command to run ahead.
	pollFirst, bulk := false, false
	for src.N > 0 && !src.IsStopped() {
		var (
			st         spliceState
			moved      int64
			qerr       error
			queuedBusy bool
		)
		rerr := inRC.Read(func(infd uintptr) bool {
			// Never wait for the caller's writer in here: that would
			// hold the source's descriptor, which its backend may be
			// closing.
			if queuedBusy, qerr = o.beginSplice(); qerr != nil || queuedBusy {
				return true
			}
			defer o.endSplice()
			waited := false
			if pollFirst {
				pollFirst = false
				if !backend.PollReadable(int(infd)) {
					st = spliceSourceEmpty
					return false // the poller waits for the command's next write
				}
				waited = true
				if qerr = o.stillSplicing(); qerr != nil {
					return true
				}
			}
			for range 1000 {
				if cerr := outRC.Control(func(outfd uintptr) {
					moved, st = spliceOnce(int(infd), int(outfd), min(src.N, spliceMax))
				}); cerr != nil {
					st = spliceFailed
				}
				switch st {
				case spliceAgain:
					continue
				case spliceSourceEmpty:
					// A command that is streaming writes again in
					// moments: wait for it here, in poll(2), rather
					// than in the netpoller, whose every wake-up costs
					// several more syscalls and task switches of this
					// process's threads. One that has gone quiet is
					// left to the netpoller, which costs nothing while
					// it waits.
					if !waited && backend.PollReadable(int(infd)) {
						waited = true
						if qerr = o.stillSplicing(); qerr != nil {
							return true
						}
						continue
					}
					return false // the poller waits for the command's next write
				}
				return true
			}
			st = spliceFailed
			return true
		})
		switch {
		case qerr != nil:
			return n, qerr, true
		case rerr != nil:
			// The source's descriptor is closed: the plain copy meets
			// that where it belongs, as a read error.
			return n, nil, false
		case queuedBusy:
			o.waitQueued()
			continue
		}
		switch st {
		case spliceMoved:
			if n < backend.BulkAfter && n+moved >= backend.BulkAfter {
				// A bulk stream: both pipes grow, so that each
				// turn may move more.
				bulk = backend.GrowBulk(src.R) && backend.GrowBulk(out)
			}
			n += moved
			src.Spliced(moved, nil)
			pollFirst = true
			if bulk && moved < backend.BulkPipe/4 {
				backend.Nap()
			}
		case spliceEOF:
			return n, nil, true
		case spliceOutFull:
			if err := o.waitWritable(outRC); err != nil {
				return n, err, true
			}
		case spliceSourceEmpty:
			// The netpoller saw the source readable; take it from the
			// top.
		default:
			// splice(2) refused these two, or failed: the plain copy
			// takes it from here and meets the same error, if any.
			return n, nil, false
		}
	}
	return n, nil, true
}

// stillSplicing is why nothing more may be written, looked at again after
// a wait in poll(2): beginSplice looked before it, and the queue may have
// been given up on meanwhile, after which not a byte more may reach the
// caller's file.
func (o *outWriter) stillSplicing() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stopped()
}

type spliceState int

const (
	spliceMoved       spliceState = iota // moved > 0 bytes
	spliceEOF                            // the source has ended
	spliceSourceEmpty                    // nothing to move yet
	spliceOutFull                        // the caller's file has no room
	spliceAgain                          // interrupted: try again at once
	spliceFailed                         // splice(2) cannot move these bytes
)

// spliceOnce moves up to max bytes from the pipe in to out without
// blocking, and says what became of it. Both descriptors are non-blocking
// for the call (SPLICE_F_NONBLOCK; the pipes of os.Pipe are anyway), so
// EAGAIN is either side's: a look at both tells which.
func spliceOnce(in, out int, max int64) (int64, spliceState) {
	n, err := unix.Splice(in, nil, out, nil, int(max), unix.SPLICE_F_NONBLOCK)
	switch {
	case err == nil && n > 0:
		return n, spliceMoved
	case err == nil:
		return 0, spliceEOF
	case errors.Is(err, unix.EINTR):
		return 0, spliceAgain
	case !errors.Is(err, unix.EAGAIN):
		return 0, spliceFailed
	}
	fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(out), Events: unix.POLLOUT}}
	if _, err := unix.Poll(fds, 0); err != nil {
		return 0, spliceAgain
	}
	switch {
	case fds[1].Revents == 0:
		return 0, spliceOutFull
	case fds[0].Revents == 0:
		return 0, spliceSourceEmpty
	}
	return 0, spliceAgain
}

// waitWritable waits until the caller's file has room (or is broken: the
// next splice says how), looking between turns whether it was given up
// on.
func (o *outWriter) waitWritable(rc syscall.RawConn) error {
	for {
		if o.isAbandoned() {
			return errWriterAbandoned
		}
		ready := false
		if err := rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
			if n, err := unix.Poll(fds, spliceOutWait); err == nil && n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
				ready = true
			}
		}); err != nil {
			return nil
		}
		if ready {
			return nil
		}
	}
}
