package server

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/policy"
)

// withEgress gives an allowlist request the egress proxy its backend
// needs (the facade does this for local callers): a proxy on a private
// unix socket for this one execution, whose every connection is logged.
// Injected secrets are not part of the protocol, so none are bound here.
// stop ends the proxy once the execution is over.
func withEgress(req *backend.Request, log *slog.Logger) (_ *backend.Request, stop func(), err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if req.Network.Mode != policy.NetworkAllowlist || req.Egress != nil {
		return req, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "pulse-egress-")
	if err != nil {
		return nil, nil, fmt.Errorf("egress: %w", err)
	}
	p, err := egress.New(egress.Config{
		Policy: req.Network,
		Logger: log,
		OnEvent: func(ev egress.Event) {
			log.Info("egress", "execution_id", req.ExecutionID, "method", ev.Method, "host", ev.Host, "port", ev.Port,
				"allowed", ev.Allowed, "rule", ev.Rule, "reason", ev.Reason, "sent", ev.Sent, "received", ev.Received)
		},
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("%w: %v", backend.ErrInvalidRequest, err)
	}
	sock := filepath.Join(dir, "proxy.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("egress: %w", err)
	}
	done := make(chan struct{})
	go func() { p.Serve(l); close(done) }()
	r := *req
	r.Egress = &backend.Egress{Socket: sock}
	return &r, func() {
		p.Close()
		<-done
		os.RemoveAll(dir)
	}, nil
}
