package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// link is one WebSocket connection to the server. One goroutine reads
// frames into a channel, so that the owner can wait on frames, its
// context and timers at once; the channel is closed when the connection
// ends, and err then says why.
type link struct {
	ws     *websocket.Conn
	frames chan []byte
	err    error         // set before frames is closed
	done   chan struct{} // closed with frames
	stop   context.CancelFunc
	wmu    sync.Mutex
	next   atomic.Int64

	// later holds, by request id, what to do with the replies to
	// requests sent with sendLater: whichever read of the connection
	// comes next (a call, wait) hands such a reply here instead of
	// taking it for its own.
	lmu   sync.Mutex
	later map[string]func(*reply)

	// caps is the capabilities answer the server gave with the upgrade
	// (protocol.HeaderCapabilities), until fetchCapabilities takes it;
	// nil when it gave none.
	caps *protocol.Reply
}

// dial opens and authenticates a connection. Its errors wrap
// backend.ErrUnavailable and say, through one of ErrUnreachable,
// ErrUnauthorized, ErrTLS or ErrVersion, what went wrong.
func (b *Backend) dial(ctx context.Context) (*link, error) {
	dctx, cancel := context.WithTimeout(ctx, b.o.dialTimeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, b.u.String(), &websocket.DialOptions{
		HTTPClient: b.client,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + b.o.token}, protocol.HeaderCapabilities: {protocol.CapabilitiesAsk}},
	})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return nil, b.classify(ctx, err, resp)
	}
	// A result or an overlay arrives as one frame; both are bounded by
	// the overlay limit (base64 grows data by a third).
	ws.SetReadLimit(b.o.maxOverlay/3*4 + 64<<20)
	lctx, stop := context.WithCancel(context.Background())
	l := &link{ws: ws, frames: make(chan []byte, 64), done: make(chan struct{}), stop: stop}
	if v := resp.Header.Get(protocol.HeaderCapabilities); v != "" {
		// A malformed answer costs only the round trip it was to save:
		// the capabilities are then asked for with the action.
		if r, err := protocol.ParseCapabilitiesHeader(v); err == nil {
			l.caps = r
		} else {
			b.log.Debug("capabilities header ignored", "err", err)
		}
	}
	go l.readLoop(lctx)
	if b.o.keepalive > 0 {
		go l.keepalive(lctx, b.o.keepalive)
	}
	return l, nil
}

// classify turns a failed dial into an error that says what to fix.
func (b *Backend) classify(ctx context.Context, err error, resp *http.Response) error {
	where := b.u.Redacted()
	wrap := func(class error, format string, args ...any) error {
		return fmt.Errorf("remote: %s: %w: %w", fmt.Sprintf(format, args...), class, backend.ErrUnavailable)
	}
	if resp != nil {
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return wrap(ErrUnauthorized, "%s refused the bearer token (HTTP %d): check %s", where, resp.StatusCode, EnvToken)
		case http.StatusServiceUnavailable:
			return wrap(ErrUnreachable, "%s is shutting down (HTTP 503)", where)
		default:
			return wrap(ErrVersion, "%s answered HTTP %d instead of a WebSocket upgrade: is it a pulse-server?", where, resp.StatusCode)
		}
	}
	var dnsErr *net.DNSError
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var certErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.As(err, &dnsErr):
		return wrap(ErrUnreachable, "cannot resolve %q: %v", b.u.Hostname(), dnsErr.Err)
	case errors.As(err, &unknownCA):
		return wrap(ErrTLS, "%s presented a certificate signed by an unknown authority: set %s to the server's CA", where, EnvTLSCA)
	case errors.As(err, &hostErr):
		return wrap(ErrTLS, "%s presented a certificate for another host: %v", where, hostErr)
	case errors.As(err, &certErr):
		return wrap(ErrTLS, "%s presented a certificate that does not verify: %v", where, certErr.Err)
	case errors.As(err, &recErr):
		return wrap(ErrTLS, "%s does not speak TLS: use ws:// or check the port", where)
	case errors.As(err, &alert) || isRemoteAlert(err):
		return wrap(ErrTLS, "%s refused the TLS handshake (%v): check %s and %s", where, err, EnvTLSCert, EnvTLSKey)
	case errors.Is(err, syscall.ECONNREFUSED):
		return wrap(ErrUnreachable, "nothing listens at %s (connection refused): is pulse-server running?", where)
	case ctx.Err() != nil:
		return fmt.Errorf("remote: connecting to %s: %w", where, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded):
		return wrap(ErrUnreachable, "no answer from %s within %v", where, b.o.dialTimeout)
	}
	return wrap(ErrUnreachable, "connecting to %s: %v", where, err)
}

// isRemoteAlert reports whether err is a TLS alert the server sent
// (certificate required, bad certificate). Over TCP crypto/tls reports one
// as a *net.OpError with Op "remote error" around an unexported alert
// type (tls.AlertError is only QUIC's), so the structured Op field is what
// tells it, not the message. With TLS 1.3 the alert arrives on the first
// read after the handshake, so it is not a handshake error.
func isRemoteAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

func (l *link) readLoop(ctx context.Context) {
	defer close(l.done)
	defer close(l.frames)
	for {
		typ, data, err := l.ws.Read(ctx)
		if err != nil {
			l.err = err
			return
		}
		if typ != websocket.MessageText {
			continue
		}
		select {
		case l.frames <- data:
		case <-ctx.Done():
			l.err = ctx.Err()
			return
		}
	}
}

// keepalive pings the server so that a connection that died without a
// word (a lost route, a sleeping laptop) is noticed and replaced.
func (l *link) keepalive(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, every)
			err := l.ws.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				l.ws.CloseNow()
				return
			}
		}
	}
}

// send writes one action with a fresh request id, which it returns.
func (l *link) send(ctx context.Context, action string, payload protocol.Payload) (string, error) {
	id := "r" + strconv.FormatInt(l.next.Add(1), 10)
	return id, l.sendID(ctx, id, action, payload)
}

// sendID writes one action under request id id.
func (l *link) sendID(ctx context.Context, id, action string, payload protocol.Payload) error {
	payload.SetRequestID(id)
	data, err := protocol.EncodeRequest(action, payload)
	if err != nil {
		return fmt.Errorf("remote: encode %s: %w", action, err)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	// A large upload on a slow link needs longer than a small request.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second+time.Duration(len(data)>>18)*time.Second)
	defer cancel()
	return l.ws.Write(wctx, websocket.MessageText, data)
}

// sendLater sends an action without waiting for its reply, which goes to
// onReply when a later read of the connection meets it; a connection
// closed first drops it. The server answers a connection's requests in
// the order they came, so whatever is sent after this runs after it.
func (l *link) sendLater(ctx context.Context, action string, payload protocol.Payload, onReply func(*reply)) error {
	// Registered before the send: the reply may be read as soon as the
	// request is out.
	id := "r" + strconv.FormatInt(l.next.Add(1), 10)
	l.lmu.Lock()
	if l.later == nil {
		l.later = map[string]func(*reply){}
	}
	l.later[id] = onReply
	l.lmu.Unlock()
	if err := l.sendID(ctx, id, action, payload); err != nil {
		l.lmu.Lock()
		delete(l.later, id)
		l.lmu.Unlock()
		return err
	}
	return nil
}

// answered hands f to the sendLater request it answers, if it answers
// one, and reports whether it did.
func (l *link) answered(f *protocol.Frame) bool {
	if f.Reply == nil {
		return false
	}
	rid := f.Reply.RequestIDOf()
	l.lmu.Lock()
	onReply, ok := l.later[rid]
	delete(l.later, rid)
	l.lmu.Unlock()
	if ok && rid != "" {
		onReply(&reply{Reply: *f.Reply, isErr: f.Type == protocol.TypeError})
	}
	return ok && rid != ""
}

// awaiting says whether a sendLater request has not been answered yet.
func (l *link) awaiting() bool {
	l.lmu.Lock()
	defer l.lmu.Unlock()
	return len(l.later) > 0
}

// call sends an action and waits for its reply (a response or an error
// frame carrying its request id). Other frames go to onFrame, when set; an
// error from onFrame ends the call. A transport failure is returned as
// the error; a refusal by the server is a reply with isErr set.
func (l *link) call(ctx context.Context, action string, payload protocol.Payload, onFrame func(*protocol.Frame) error) (*reply, error) {
	id, err := l.send(ctx, action, payload)
	if err != nil {
		return nil, err
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case data, ok := <-l.frames:
			if !ok {
				return nil, l.closedErr()
			}
			f, err := decodeFrame(data)
			if err != nil {
				return nil, fmt.Errorf("remote: %w: %w", ErrProtocol, err)
			}
			if l.answered(f) {
				continue
			}
			if f.Reply != nil {
				rid := f.Reply.RequestIDOf()
				// An error without a request id answers a frame the server
				// could not parse, which can only be ours.
				if rid == id || (rid == "" && f.Type == protocol.TypeError) {
					return &reply{Reply: *f.Reply, isErr: f.Type == protocol.TypeError}, nil
				}
			}
			if onFrame != nil {
				if err := onFrame(f); err != nil {
					return nil, err
				}
			}
		}
	}
}

// closedErr is why the read loop stopped; only valid once frames closed.
func (l *link) closedErr() error {
	if l.err == nil {
		return errors.New("connection closed")
	}
	return l.err
}

// up says whether the connection has not ended yet, and holds no frame
// nobody read (a spare one is idle: a frame on it answers nothing) but
// the replies to its sendLater requests.
func (l *link) up() bool {
	select {
	case <-l.done:
		return false
	default:
		return len(l.frames) == 0 || l.awaiting()
	}
}

func (l *link) close() {
	l.stop()
	l.ws.CloseNow()
}
