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
	// defaultBackoffMax is short because a replica that restarts (a
	// rollout, a crash) gets work as soon as it is up, but schedules it
	// only onto the workers attached to it by then: at 30 s, the
	// replica came back to the two or three workers that had just
	// started themselves, and its share of the load queued on them. A
	// refused dial every 5 s is cheap for the replica.
	defaultBackoffMax = 5 * time.Second

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

// Run attaches to every relay of cfg.RelayAddrs (each replica of a
// pulse-server fleet) and serves them until ctx is done, re-dialling each
// with backoff whenever its stream ends. The worker's capacity is one
// pool shared by its attachments: each relay is told capacity_max, and
// at most that many commands run at once across all of them (an exec
// beyond it waits for a slot). It returns nil when ctx ends, an error
// wrapping ErrTokenRefused when a relay refuses the token (after logging
// it at ERROR), one wrapping ErrMissingPrograms when a program of
// RequiredPrograms is not on PATH or the exec path's steps fail here
// (CheckExecPath), and otherwise an error only for a
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
	env := cfg.Env
	if env == nil {
		env = childEnv(os.Environ())
	}
	if err := CheckExecPath(ctx, env); err != nil {
		log.Error("cannot serve the relay", "err", err)
		return err
	}
	if cfg.Capabilities == nil {
		cfg.Capabilities = DetectCapabilities(nil)
	}
	// Said up front because every value may be a silent default: a worker
	// started with nothing set dials localhost with the development token.
	log.Info("starting", "relay", cfg.RelayAddr, "sandbox_id", cfg.SandboxID, "capacity", cfg.MaxConcurrent, "tls", cfg.TLS, "each_address", cfg.RelayEach)
	if cfg.Token == DefaultToken {
		log.Warn("SANDBOX_TOKEN not set: using the development default token")
	}
	r, err := runner.New(runner.WithEnv(env), runner.WithLogger(log))
	if err != nil {
		return err
	}
	rn, box, closeBoxes := boxRunner(ctx, r, cfg.MaxConcurrent, cfg.Isolation, log) // box.go
	defer closeBoxes()
	// What the relays are told, and what "attached" says: a worker
	// without boxes runs one at a time whatever was asked.
	cfg.MaxConcurrent = box.capacity
	// One session for every relay: its dedup cache answers a req_id
	// whichever relay sends it again. Each attachment gets a pool of its
	// own from the session; the slots bound them together.
	sess, err := session.New(session.Config{
		SandboxID:     cfg.SandboxID,
		Capacity:      box.capacity,
		Capabilities:  cfg.Capabilities,
		Image:         cfg.Image,
		Trust:         cfg.Trust,
		Heartbeat:     cfg.Heartbeat,
		Logger:        log,
		Isolation:     box.isolation,
		IsolationNote: box.note,
		Egress:        box.isolation != "",
	}, &sharedSlots{r: rn, slots: make(chan struct{}, box.capacity), boxes: box.isolation != ""})
	if err != nil {
		return err
	}
	for _, addr := range cfg.RelayAddrs() {
		if !cfg.TLS && !isLoopback(addr) {
			log.Warn("RELAY_TLS is off: the bearer token crosses the network in clear text", "relay", addr)
		}
	}

	var attached atomic.Int64
	if cfg.HealthListen != "" {
		stop, err := serveHealth(cfg.HealthListen, &attached, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	f := &fleet{cfg: cfg, sess: sess, log: log, attached: &attached, stop: cancel, running: map[string]context.CancelFunc{}}
	if err := f.update(rctx); err != nil {
		if !cfg.RelayEach {
			return err
		}
		// The relays' names may not resolve yet (their pods are
		// starting): the next look-up tries again.
		log.Warn("resolving the relays", "err", err)
	}
	if cfg.RelayEach {
		t := time.NewTicker(resolveEvery)
		defer t.Stop()
	loop:
		for {
			select {
			case <-rctx.Done():
				break loop
			case <-t.C:
				if err := f.update(rctx); err != nil {
					log.Warn("resolving the relays", "err", err)
				}
			}
		}
	}
	<-rctx.Done()
	f.wg.Wait()
	if err := context.Cause(rctx); errors.Is(err, ErrTokenRefused) {
		return err
	}
	log.Info("stopping", "reason", context.Cause(ctx))
	return nil
}

// resolveEvery is how often a worker with RelayEach looks the relay names
// up again, to attach to replicas that appeared and leave those gone.
var resolveEvery = 10 * time.Second

// fleet is the set of relays one worker is attached to.
type fleet struct {
	cfg      Config
	sess     *session.Session
	log      *slog.Logger
	attached *atomic.Int64
	stop     context.CancelCauseFunc // a refused token stops the worker
	wg       sync.WaitGroup

	mu      sync.Mutex
	running map[string]context.CancelFunc // target address → its loop
}

// target is one relay to attach to: the address dialled and the name TLS
// verifies (the host name, also when the address is one of its IPs).
type target struct{ addr, authority string }

// targets lists the relays to attach to now: the configured addresses,
// or with RelayEach every address each name resolves to.
func (f *fleet) targets(ctx context.Context) ([]target, error) {
	var out []target
	for _, a := range f.cfg.RelayAddrs() {
		if !f.cfg.RelayEach {
			out = append(out, target{addr: a, authority: a})
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("worker: relay %q: %w", a, err)
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ips, err := net.DefaultResolver.LookupHost(lctx, host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("worker: resolve %s: %w", host, err)
		}
		for _, ip := range ips {
			out = append(out, target{addr: net.JoinHostPort(ip, port), authority: a})
		}
	}
	return out, nil
}

// update starts a loop for each new target and stops those of targets
// gone. A name that does not resolve keeps the loops it had: a DNS blip
// must not detach a worker.
func (f *fleet) update(ctx context.Context) error {
	ts, err := f.targets(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := map[string]bool{}
	for _, t := range ts {
		want[t.addr] = true
		if _, ok := f.running[t.addr]; ok {
			continue
		}
		cc, err := dial(t, f.cfg)
		if err != nil {
			return err
		}
		lctx, cancel := context.WithCancel(ctx)
		f.running[t.addr] = cancel
		f.wg.Go(func() {
			defer cc.Close()
			f.serveRelay(lctx, t.addr, sandboxv1.NewSandboxWorkerClient(cc))
		})
	}
	for addr, cancel := range f.running {
		if !want[addr] {
			f.log.Info("relay address gone; detaching", "relay", addr)
			cancel()
			delete(f.running, addr)
		}
	}
	return nil
}

func dial(t target, cfg Config) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials
	if cfg.TLS {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	} else {
		creds = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxExecFrame)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, PermitWithoutStream: false}),
	}
	if t.authority != t.addr {
		opts = append(opts, grpc.WithAuthority(t.authority))
	}
	cc, err := grpc.NewClient("passthrough:///"+t.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("worker: %w: %w", ErrConfig, err)
	}
	return cc, nil
}

// serveRelay attaches to one relay until ctx ends, re-dialling with
// backoff. A refused token stops the whole worker.
func (f *fleet) serveRelay(ctx context.Context, addr string, client sandboxv1.SandboxWorkerClient) {
	cfg, log := f.cfg, f.log.With("relay", addr)
	bo := backoff{min: cfg.BackoffMin, max: cfg.BackoffMax}
	if bo.min == 0 {
		bo.min = defaultBackoffMin
	}
	if bo.max == 0 {
		bo.max = defaultBackoffMax
	}
	for {
		started := time.Now()
		var attached atomic.Bool
		err := attach(ctx, client, addr, cfg, f.sess, log, &attached, f.attached)
		if ctx.Err() != nil {
			return
		}
		if refused(err) {
			log.Error("relay refused the token; check SANDBOX_TOKEN against the relay's worker tokens", "sandbox_id", cfg.SandboxID, "err", err)
			f.stop(fmt.Errorf("%w: %w", ErrTokenRefused, err))
			return
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
			return
		case <-t.C:
		}
	}
}

// sharedSlots is the worker's one pool of capacity across its relays:
// each relay counts only what it sent, so together they may send more
// than capacity_max; the extra execs wait here, before their process
// (and its timeout) starts, rather than running beyond the capacity the
// worker announced.
//
// On a worker that boxes executions the slots are the boxes: the relay's
// own steps around one (make its directory, move the workspace in and the
// overlay out, remove them) are short commands of its own, bounded per
// relay by the capacity each was told, and do not wait here. Were they to
// take a slot, an execution would queue once per step behind every box
// the relays sent, instead of once.
type sharedSlots struct {
	r     runner.Runner
	slots chan struct{}
	boxes bool
}

func (s *sharedSlots) Run(ctx context.Context, spec runner.Spec, sink runner.Sink) (int32, error) {
	if s.boxes && spec.Box == nil {
		return s.r.Run(ctx, spec, sink)
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return -1, fmt.Errorf("%w: waiting for a slot: %w", runner.ErrAborted, context.Cause(ctx))
	}
	defer func() { <-s.slots }()
	return s.r.Run(ctx, spec, sink)
}

// serveHealth serves /healthz (the process runs) and /readyz (attached to
// a relay at least, so a relay can hand this worker work) on addr over plain
// HTTP until stop is called. Neither holds anything a command could use.
func serveHealth(addr string, attached *atomic.Int64, log *slog.Logger) (stop func(), err error) {
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
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { answer(w, attached.Load() > 0) })
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
func attach(ctx context.Context, client sandboxv1.SandboxWorkerClient, addr string, cfg Config, sess *session.Session, log *slog.Logger, attached *atomic.Bool, count *atomic.Int64) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+cfg.Token)
	st, err := client.Attach(sctx)
	if err != nil {
		return fmt.Errorf("worker: attach: %w", err)
	}
	log.Info("connected; waiting for the relay to accept the token")
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
			count.Add(1)
			log.Info("attached", "sandbox_id", cfg.SandboxID, "capacity", cfg.MaxConcurrent, "evidence", evidence)
		}
	})
	err = sess.Serve(sctx, ws)
	close(served)
	wg.Wait()
	if attached.Load() {
		count.Add(-1)
	}
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
