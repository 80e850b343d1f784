package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker/runner"
	"github.com/pulse-agent/pulse/internal/worker/session"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrTokenRefused: the relay answered Unauthenticated or PermissionDenied.
// Retrying cannot help, so Run stops with it.
var ErrTokenRefused = errors.New("worker: relay refused the token")

// attachQuiet is how long a fresh stream must go unrefused before the
// worker calls itself attached when the relay has sent nothing yet. The
// protocol has no acceptance frame: a relay refuses the token as its first
// answer, within one round trip, and otherwise stays silent until it has
// work. A variable so tests can shorten it.
var attachQuiet = 2 * time.Second

const (
	defaultBackoffMin = 500 * time.Millisecond
	defaultBackoffMax = 30 * time.Second

	// MaxExecFrame is the largest ServerFrame the worker accepts. gRPC's
	// 4 MiB default is too small for a base64 stdin carrying a file or a
	// workspace archive (pulse-server sends up to 32 MiB compressed, 43
	// MiB in base64), and an oversize frame does not fail one exec: it
	// tears down the whole stream. A relay should refuse larger Execs
	// itself. The relay is trusted with far more than memory already: it
	// chooses the commands.
	MaxExecFrame = 64 << 20

	// keepaliveTime is the interval of HTTP/2 pings while the relay is
	// silent. gRPC servers by default punish pings more frequent than
	// every 5 minutes (GOAWAY too_many_pings), so this is the shortest
	// safe value against a relay with default settings; with it gRPC
	// also sets TCP_USER_TIMEOUT, so a vanished relay is noticed even
	// while a Send is blocked.
	keepaliveTime    = 5 * time.Minute
	keepaliveTimeout = 20 * time.Second
)

// Run connects to the relay and serves it until ctx is done, re-dialling
// with backoff whenever the stream ends. It returns nil when ctx ends, an
// error wrapping ErrTokenRefused when the relay refuses the token (after
// logging it at ERROR), one wrapping ErrMissingPrograms when a program of
// RequiredPrograms is not on PATH, and otherwise an error only for a
// configuration it cannot start with.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := CheckPrograms(nil); err != nil {
		log.Error("cannot serve the relay", "err", err)
		return err
	}
	if cfg.Capabilities == nil {
		cfg.Capabilities = DetectCapabilities(nil)
	}
	// Said up front because every value may be a silent default: a worker
	// started with nothing set dials localhost with the development token.
	log.Info("starting", "relay", cfg.RelayAddr, "sandbox_id", cfg.SandboxID, "capacity", cfg.MaxConcurrent, "tls", cfg.TLS)
	if cfg.Token == DefaultToken {
		log.Warn("SANDBOX_TOKEN not set: using the development default token")
	}
	env := cfg.Env
	if env == nil {
		env = childEnv(os.Environ())
	}
	r, err := runner.New(runner.WithEnv(env), runner.WithLogger(log))
	if err != nil {
		return err
	}
	sess, err := session.New(session.Config{
		SandboxID:    cfg.SandboxID,
		Capacity:     cfg.MaxConcurrent,
		Capabilities: cfg.Capabilities,
		Image:        cfg.Image,
		Trust:        cfg.Trust,
		Heartbeat:    cfg.Heartbeat,
		Logger:       log,
	}, r)
	if err != nil {
		return err
	}

	var creds credentials.TransportCredentials
	if cfg.TLS {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	} else {
		creds = insecure.NewCredentials()
		if !isLoopback(cfg.RelayAddr) {
			log.Warn("RELAY_TLS is off: the bearer token crosses the network in clear text", "relay", cfg.RelayAddr)
		}
	}
	cc, err := grpc.NewClient(cfg.RelayAddr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxExecFrame)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, PermitWithoutStream: false}),
	)
	if err != nil {
		return fmt.Errorf("worker: %w: %w", ErrConfig, err)
	}
	defer cc.Close()
	client := sandboxv1.NewSandboxWorkerClient(cc)

	var attached atomic.Bool
	if cfg.HealthListen != "" {
		stop, err := serveHealth(cfg.HealthListen, &attached, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	bo := backoff{min: cfg.BackoffMin, max: cfg.BackoffMax}
	if bo.min == 0 {
		bo.min = defaultBackoffMin
	}
	if bo.max == 0 {
		bo.max = defaultBackoffMax
	}
	for {
		started := time.Now()
		err := attach(ctx, client, cfg, sess, log, &attached)
		attached.Store(false)
		if ctx.Err() != nil {
			log.Info("stopping", "reason", context.Cause(ctx))
			return nil
		}
		if refused(err) {
			log.Error("relay refused the token; check SANDBOX_TOKEN against the relay's worker tokens", "relay", cfg.RelayAddr, "sandbox_id", cfg.SandboxID, "err", err)
			return fmt.Errorf("%w: %w", ErrTokenRefused, err)
		}
		// A connection that stayed up for a while was healthy: the next
		// failure starts the backoff over.
		if time.Since(started) > bo.max {
			bo.reset()
		}
		wait := bo.next()
		log.Warn("relay connection ended; reconnecting", "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			log.Info("stopping", "reason", context.Cause(ctx))
			return nil
		case <-t.C:
		}
	}
}

// serveHealth serves /healthz (the process runs) and /readyz (attached to
// the relay, so the relay can hand this worker work) on addr over plain
// HTTP until stop is called. Neither holds anything a command could use.
func serveHealth(addr string, attached *atomic.Bool, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("worker: %w: health listener: %w", ErrConfig, err)
	}
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, ok bool) {
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"status":"not_ready"}`)
			return
		}
		io.WriteString(w, `{"status":"ok"}`)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { answer(w, true) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { answer(w, attached.Load()) })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go hs.Serve(lis)
	log.Info("health endpoints listening", "url", "http://"+lis.Addr().String()+"/readyz")
	return func() { hs.Close() }, nil
}

// refused reports whether err is the relay's answer to a bad token.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// attach opens one Attach stream and serves it until it ends. It logs
// "connected" once the stream is open and "attached" only once the relay
// has sent a frame or let attachQuiet pass without refusing the token.
func attach(ctx context.Context, client sandboxv1.SandboxWorkerClient, cfg Config, sess *session.Session, log *slog.Logger, attached *atomic.Bool) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+cfg.Token)
	st, err := client.Attach(sctx)
	if err != nil {
		return fmt.Errorf("worker: attach: %w", err)
	}
	log.Info("connected; waiting for the relay to accept the token", "relay", cfg.RelayAddr)
	ws := &watchedStream{SandboxWorker_AttachClient: st, firstFrame: make(chan struct{})}
	served := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		quiet := time.NewTimer(attachQuiet)
		defer quiet.Stop()
		var evidence string
		select {
		case <-ws.firstFrame:
			evidence = "first relay frame"
		case <-quiet.C:
			evidence = "no refusal within " + attachQuiet.String()
		case <-served:
			return
		}
		select {
		case <-served: // ended meanwhile: "attached" would now be false
		default:
			attached.Store(true)
			log.Info("attached", "relay", cfg.RelayAddr, "sandbox_id", cfg.SandboxID, "capacity", cfg.MaxConcurrent, "evidence", evidence)
		}
	})
	err = sess.Serve(sctx, ws)
	close(served)
	wg.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// watchedStream tells attach when the relay's first frame arrives, and
// turns an io.EOF on the first Send into the relay's status.
type watchedStream struct {
	sandboxv1.SandboxWorker_AttachClient
	firstFrame chan struct{}
	once       sync.Once
	sends      atomic.Int64
}

func (w *watchedStream) Recv() (*sandboxv1.ServerFrame, error) {
	f, err := w.SandboxWorker_AttachClient.Recv()
	if err == nil {
		w.once.Do(func() { close(w.firstFrame) })
	}
	return f, err
}

func (w *watchedStream) Send(f *sandboxv1.WorkerFrame) error {
	err := w.SandboxWorker_AttachClient.Send(f)
	// io.EOF means the relay already ended the stream, a refused token
	// for instance; the status, which says why, comes from Recv. Only the
	// first Send (Hello) may call Recv here: the session sends it before
	// it starts receiving, later Sends race with its receive loop.
	if w.sends.Add(1) == 1 && errors.Is(err, io.EOF) {
		if _, rerr := w.SandboxWorker_AttachClient.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			return rerr
		}
	}
	return err
}

// backoff doubles from min to max; each wait is drawn uniformly from
// [d/2, d] so that workers cut off together do not return together.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	half := b.cur / 2
	return half + rand.N(b.cur-half+1)
}

func (b *backoff) reset() { b.cur = 0 }

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
