// Package egressrun runs the egress proxy of one execution beside its
// box, for the two hosts of boxes that are not the facade: pulse-server's
// local executor and pulse-worker, which runs it beside each boxed exec so
// that the values of injected secrets never enter the box.
package egressrun

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// Start gives an allowlist request the egress proxy its backend needs
// (the facade does this for its own callers): a proxy on a private
// unix socket for this one execution. The secrets a client bound to
// hosts (req.Egress.Inject, from submit's inject) are injected by it,
// with a CA of this execution's own put where the command's TLS clients
// look. Every connection is logged (never a secret's value) and
// collected; stop ends the proxy once the execution is over and returns
// the connections, at most protocol.MaxNetworkEvents of them (refusals
// kept before allowed connections), and how many more there were.
func Start(req *backend.Request, log *slog.Logger) (_ *backend.Request, stop func() ([]backend.NetworkEvent, int), err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	none := func() ([]backend.NetworkEvent, int) { return nil, 0 }
	if req.Network.Mode != policy.NetworkAllowlist || (req.Egress != nil && req.Egress.Socket != "") {
		return req, none, nil
	}
	var inject []egress.Injection
	if req.Egress != nil {
		for _, in := range req.Egress.Inject {
			inject = append(inject, egress.Injection{Name: in.Name, Value: in.Value, Placeholder: in.Placeholder, Hosts: in.Hosts})
		}
	}
	dir, err := os.MkdirTemp("", "pulse-egress-")
	if err != nil {
		return nil, nil, fmt.Errorf("egress: %w", err)
	}
	be := &backend.Egress{Socket: filepath.Join(dir, "proxy.sock")}
	var ca *egress.CA
	if len(inject) > 0 {
		if ca, err = egress.NewCA(); err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("egress: %w", err)
		}
		be.CAFile, be.CA = filepath.Join(dir, "ca.pem"), ca.CertPEM()
		if err := os.WriteFile(be.CAFile, append(backend.SystemRoots(), be.CA...), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("egress CA: %w", err)
		}
	}
	var mu sync.Mutex
	var events []backend.NetworkEvent
	dropped := 0
	p, err := egress.New(egress.Config{
		Policy: req.Network,
		Inject: inject,
		CA:     ca,
		Logger: log,
		OnEvent: func(ev egress.Event) {
			log.Info("egress", "execution_id", req.ExecutionID, "method", ev.Method, "host", ev.Host, "port", ev.Port,
				"allowed", ev.Allowed, "rule", ev.Rule, "reason", ev.Reason, "injected", ev.Injected, "sent", ev.Sent, "received", ev.Received)
			mu.Lock()
			defer mu.Unlock()
			if len(events) >= protocol.MaxNetworkEvents {
				// Full: a refusal takes the place of the earliest allowed
				// connection, so that a command cannot push the refusal
				// of what it was after out of the report (and so out of
				// the client's audit log) with allowed requests made
				// first. Either way one connection is left out.
				dropped++
				i := slices.IndexFunc(events, func(e backend.NetworkEvent) bool { return e.Allowed })
				if ev.Allowed || i < 0 {
					return
				}
				events = slices.Delete(events, i, i+1)
			}
			events = append(events, backend.NetworkEvent{Method: ev.Method, Host: ev.Host, Port: ev.Port, Addr: ev.Addr,
				Allowed: ev.Allowed, Rule: ev.Rule, Reason: ev.Reason, Injected: ev.Injected,
				Sent: ev.Sent, Received: ev.Received, Duration: ev.Duration})
		},
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("%w: %v", backend.ErrInvalidRequest, err)
	}
	l, err := net.Listen("unix", be.Socket)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("egress: %w", err)
	}
	done := make(chan struct{})
	go func() { p.Serve(l); close(done) }()
	r := *req
	r.Egress = be
	return &r, func() ([]backend.NetworkEvent, int) {
		// Close waits for the connections, so every event is in.
		p.Close()
		<-done
		os.RemoveAll(dir)
		mu.Lock()
		defer mu.Unlock()
		return events, dropped
	}, nil
}
