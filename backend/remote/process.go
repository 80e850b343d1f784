package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// Errors of a dial into a remote sandbox (Process.DialPort).
var (
	// ErrPortNotExposed: the server refused a port the execution's
	// network policy does not list in expose. Wrapped with
	// backend.ErrInvalidRequest.
	ErrPortNotExposed = errors.New("remote server refused a port the policy does not expose")
	// ErrDialFailed: nothing accepted the connection inside the sandbox.
	ErrDialFailed = errors.New("nothing accepted the connection inside the remote sandbox")
)

var (
	_ backend.Starter         = (*Backend)(nil)
	_ backend.TerminalStarter = (*Backend)(nil)
)

// Start implements backend.Starter: the command is submitted as a
// process (protocol.FeatureProcess) and Start returns once the server
// says it runs. Its output, reconnection, cancellation, result and
// overlay are Exec's; its input is streamed from Request.Stdin as the
// caller writes it; Signal, Resize and DialPort reach it through the
// server. Against a server without the feature it returns an error
// wrapping backend.ErrUnsupported.
func (b *Backend) Start(ctx context.Context, req *backend.Request) (backend.Process, error) {
	return backend.Background(ctx, func(ctx context.Context, started func(backend.Control)) (*backend.Result, error) {
		return b.exec(ctx, req, started)
	})
}

// StartsTerminals implements backend.TerminalStarter: whether the server
// listed the tty feature at the last Probe.
func (b *Backend) StartsTerminals() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.server.features[protocol.FeatureTTY]
}

// checkProcess refuses a process the server cannot run as asked.
func checkProcess(req *backend.Request, info serverInfo) error {
	if !info.features[protocol.FeatureProcess] {
		return fmt.Errorf("remote: the server does not run processes in the background (no %q feature): %w", protocol.FeatureProcess, backend.ErrUnsupported)
	}
	if req.TTY != nil && !info.features[protocol.FeatureTTY] {
		return fmt.Errorf("remote: the server makes no terminals (no %q feature): %w", protocol.FeatureTTY, backend.ErrUnsupported)
	}
	if req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0) {
		return invalid("terminal size %dx%d", req.TTY.Rows, req.TTY.Cols)
	}
	return nil
}

// stdinChunk is how much input one stdin request carries at most.
const stdinChunk = 256 << 10

// procControl is what a started process's handle does through the
// server: each signal and resize on a connection of its own, the input
// on one connection kept while there is input to send, dials as
// WebSocket upgrades.
type procControl struct {
	b    *Backend
	id   string
	dial bool

	ctx    context.Context // ends when the execution's run does
	cancel context.CancelFunc
	done   chan struct{} // closed when the pump has returned
}

func (b *Backend) control(id string, info serverInfo) *procControl {
	ctx, cancel := context.WithCancel(context.Background())
	return &procControl{b: b, id: id, dial: info.features[protocol.FeatureDial], ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// stop ends the pump: closeStdin unblocks its read, the cancellation its
// request; it returns once the pump has.
func (c *procControl) stop(closeStdin func()) {
	closeStdin()
	c.cancel()
	<-c.done
}

// once sends one action on a connection of its own. The call is not
// cut short when the run ends: a signal that ends the command makes the
// run end while its answer is on the way, and that answer is the
// caller's (cutting it would report a delivered signal as ErrProcessDone).
func (c *procControl) once(action string, p protocol.Payload) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), c.b.o.dialTimeout+10*time.Second)
	defer cancel()
	return c.b.onLink(ctx, func(l *link) error {
		r, err := l.call(ctx, action, p, nil)
		if err != nil {
			if c.ctx.Err() != nil {
				return backend.ErrProcessDone
			}
			return c.b.unreachable(action, err)
		}
		return processReply(action, r)
	})
}

// processReply maps the server's answer to a process action.
func processReply(action string, r *reply) error {
	switch {
	case !r.isErr:
		return nil
	case r.Code == protocol.CodeNotRunning, r.Code == protocol.CodeNotFound:
		return backend.ErrProcessDone
	case r.Code == protocol.CodeUnsupported:
		return fmt.Errorf("remote: %s: %s: %w", action, r.Message, backend.ErrUnsupported)
	case r.Code == protocol.CodeInvalid:
		return fmt.Errorf("remote: %s: %s: %w", action, r.Message, backend.ErrInvalidRequest)
	}
	return fmt.Errorf("remote: %s answered %q %q: %w", action, r.Code, r.Message, ErrProtocol)
}

// Signal implements backend.Control.
func (c *procControl) Signal(sig os.Signal) error {
	name, ok := protocol.SignalName(sig)
	if !ok {
		return fmt.Errorf("remote: signal %v cannot be sent to the server: %w", sig, backend.ErrUnsupported)
	}
	return c.once(protocol.ActionSignal, &protocol.Signal{ExecutionID: c.id, Signal: name})
}

// Resize implements backend.Resizer; the server refuses it for a process
// without a terminal.
func (c *procControl) Resize(rows, cols uint16) error {
	return c.once(protocol.ActionResize, &protocol.Resize{ExecutionID: c.id, TTYSize: protocol.TTYSize{Rows: rows, Cols: cols}})
}

// DialPort implements backend.PortDialer: a dial through the server
// (protocol.FeatureDial), which connects to the port inside the sandbox.
func (c *procControl) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if !c.dial {
		return nil, fmt.Errorf("remote: the server cannot reach ports inside its sandboxes (no %q feature): %w", protocol.FeatureDial, backend.ErrUnsupported)
	}
	dctx, cancel := context.WithTimeout(ctx, c.b.o.dialTimeout+10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, c.b.u.String(), &websocket.DialOptions{
		HTTPClient: c.b.client,
		HTTPHeader: http.Header{
			"Authorization":              {"Bearer " + c.b.o.token},
			protocol.HeaderDialExecution: {c.id},
			protocol.HeaderDialPort:      {strconv.Itoa(port)},
		},
	})
	if err != nil {
		return nil, c.dialRefused(ctx, port, err, resp)
	}
	// The connection outlives ctx, which bounds the set-up only.
	ws.SetReadLimit(4 << 20)
	return websocket.NetConn(context.Background(), ws, websocket.MessageBinary), nil
}

// dialRefused reads the code of a refused dial from the error frame in
// the HTTP answer's body.
func (c *procControl) dialRefused(ctx context.Context, port int, err error, resp *http.Response) error {
	if resp == nil {
		return c.b.classify(ctx, err, nil)
	}
	var f struct {
		Payload protocol.Reply `json:"payload"`
	}
	if resp.Body != nil {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		json.Unmarshal(body, &f)
	}
	switch f.Payload.Code {
	case protocol.CodeNotExposed:
		return fmt.Errorf("remote: port %d: %w: %w", port, ErrPortNotExposed, backend.ErrInvalidRequest)
	case protocol.CodeDialFailed:
		return fmt.Errorf("remote: port %d: %w", port, ErrDialFailed)
	case protocol.CodeNotRunning, protocol.CodeNotFound:
		return backend.ErrProcessDone
	case protocol.CodeUnsupported:
		return fmt.Errorf("remote: port %d: %s: %w", port, f.Payload.Message, backend.ErrUnsupported)
	}
	return c.b.classify(ctx, err, resp)
}

// pump streams the process's input to the server, in order, each byte
// once: every request says the offset of its data, and after a lost
// connection the request is sent again on a new one, the server skipping
// what it had. It ends at the input's end (sent as eof), when the server
// says the process is over, or at stop.
func (c *procControl) pump(in io.Reader) {
	defer close(c.done)
	var l *link
	defer func() {
		if l != nil {
			l.close()
		}
	}()
	send := func(off int64, data []byte, eof bool) bool {
		for n := 0; ; n++ {
			if c.ctx.Err() != nil {
				return false
			}
			if l == nil {
				var err error
				if l, err = c.b.dial(c.ctx); err != nil {
					if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrTLS) {
						c.b.log.Error("process input not sent", "execution_id", c.id, "err", err)
						return false
					}
					c.pause(n)
					continue
				}
			}
			r, err := l.call(c.ctx, protocol.ActionStdin, &protocol.Stdin{ExecutionID: c.id, Offset: off, Data: data, EOF: eof}, nil)
			switch {
			case err != nil:
				l.close()
				l = nil
				c.pause(n)
			case r.isErr && r.Code == protocol.CodeBusy:
				// The request sent on a lost connection is still being
				// written; the server skips what it took.
				c.pause(n)
			case r.isErr:
				if perr := processReply(protocol.ActionStdin, r); !errors.Is(perr, backend.ErrProcessDone) {
					c.b.log.Warn("process input refused", "execution_id", c.id, "err", perr)
				}
				return false
			default:
				return true
			}
		}
	}
	if in == nil {
		send(0, nil, true)
		return
	}
	buf := make([]byte, stdinChunk)
	var off int64
	for {
		n, err := in.Read(buf)
		eof := errors.Is(err, io.EOF)
		if n > 0 || eof {
			if !send(off, buf[:n], eof) {
				return
			}
			off += int64(n)
		}
		if err != nil {
			return
		}
	}
}

// pause waits before attempt n+1 of a request, or until stop.
func (c *procControl) pause(n int) {
	select {
	case <-time.After(backoff(n)):
	case <-c.ctx.Done():
	}
}
