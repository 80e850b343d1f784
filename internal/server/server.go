package server

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

// Defaults and bounds of the server's settings.
const (
	DefaultMaxConcurrent   = 10
	MaxConcurrentLimit     = 128
	DefaultRetention       = 24 * time.Hour
	MaxRetention           = 8760 * time.Hour
	DefaultMaxMessageBytes = 50 << 20
	DefaultOutboxBytes     = 256 << 20
	DefaultCleanupInterval = 5 * time.Minute
	DefaultUploadGrace     = time.Hour
	DefaultCancelWait      = 10 * time.Second
	DefaultPingInterval    = 20 * time.Second
	// DefaultLease is how long a replica's lease in a shared store lasts
	// without renewal (renewed every third of it): how long the executions
	// of a replica that died stay RUNNING before another marks them.
	DefaultLease = 15 * time.Second
)

// ErrConfig is wrapped by every configuration error of New.
var ErrConfig = errors.New("invalid server configuration")

type options struct {
	tokens          []string
	production      bool
	maxConcurrent   int
	workspaceRoot   string
	retention       time.Duration
	maxMessage      int64
	outboxBytes     int
	limits          protocol.ArchiveLimits
	network         policy.NetworkPolicy
	secrets         secrets.Policy
	maxOutput       int64
	ceiling         policy.ResourceLimits
	cleanupInterval time.Duration
	uploadGrace     time.Duration
	cancelWait      time.Duration
	pingInterval    time.Duration
	lease           time.Duration
	log             *slog.Logger
	now             func() time.Time
}

// Option configures New.
type Option func(*options) error

// WithTokens sets the accepted bearer tokens (required).
func WithTokens(tokens ...string) Option {
	return func(o *options) error { o.tokens = append(o.tokens, tokens...); return nil }
}

// WithProduction refuses weak tokens (see CheckTokenStrength).
func WithProduction(on bool) Option { return func(o *options) error { o.production = on; return nil } }

// WithMaxConcurrent bounds the executions running at once (1-128).
func WithMaxConcurrent(n int) Option {
	return func(o *options) error {
		if n < 1 || n > MaxConcurrentLimit {
			return fmt.Errorf("max concurrent executions %d not in 1-%d: %w", n, MaxConcurrentLimit, ErrConfig)
		}
		o.maxConcurrent = n
		return nil
	}
}

// WithWorkspaceRoot sets the directory holding tenant workspaces
// (required).
func WithWorkspaceRoot(dir string) Option {
	return func(o *options) error { o.workspaceRoot = dir; return nil }
}

// WithRetention sets how long terminal records and their workspaces are
// kept (1 hour to 8760 hours).
func WithRetention(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Hour || d > MaxRetention {
			return fmt.Errorf("retention %v not in 1h-8760h: %w", d, ErrConfig)
		}
		o.retention = d
		return nil
	}
}

// WithMaxMessageBytes bounds one client frame (default 50 MiB).
func WithMaxMessageBytes(n int64) Option {
	return func(o *options) error {
		if n < 1024 {
			return fmt.Errorf("max message bytes %d too small: %w", n, ErrConfig)
		}
		o.maxMessage = n
		return nil
	}
}

// WithOutboxBytes bounds what may wait to be sent to one client; a client
// that falls further behind is disconnected and must reattach with
// after_seq (default 256 MiB).
func WithOutboxBytes(n int) Option {
	return func(o *options) error { o.outboxBytes = n; return nil }
}

// WithArtifactLimits bounds uploads.
func WithArtifactLimits(l protocol.ArchiveLimits) Option {
	return func(o *options) error { o.limits = l; return nil }
}

// WithDefaultPolicies sets the network and secret policies of a submission
// that names none (default: deny-all for both).
func WithDefaultPolicies(n policy.NetworkPolicy, s secrets.Policy) Option {
	return func(o *options) error { o.network, o.secrets = n, s; return nil }
}

// WithMaxOutputBytes caps each of stdout and stderr of one execution
// (default policy.DefaultOutputBytes).
func WithMaxOutputBytes(n int64) Option {
	return func(o *options) error { o.maxOutput = n; return nil }
}

// WithLimitCeiling sets the largest memory, CPU, pids, file-size and disk
// limits a submission may have: a larger request, or none (which means
// unlimited), is clamped to it. A zero field sets no ceiling. The output
// ceiling is WithMaxOutputBytes and the timeout's is 24 hours.
func WithLimitCeiling(l policy.ResourceLimits) Option {
	return func(o *options) error {
		if l.Timeout != 0 || l.OutputBytes != 0 {
			return fmt.Errorf("limit ceiling: timeout and output have their own bounds: %w", ErrConfig)
		}
		if l.MemoryBytes < 0 || l.Pids < 0 || l.FileSizeBytes < 0 || l.DiskBytes < 0 || math.IsNaN(l.CPUs) || l.CPUs < 0 {
			return fmt.Errorf("limit ceiling %+v has a negative field: %w", l, ErrConfig)
		}
		o.ceiling = l
		return nil
	}
}

// effectiveLimits clamps what a submission asked for (nil: nothing) by
// the server's ceilings and fills in the timeout and output cap.
func (s *Server) effectiveLimits(asked *policy.ResourceLimits, timeout time.Duration) policy.ResourceLimits {
	var l policy.ResourceLimits
	if asked != nil {
		l = *asked
	}
	c := s.o.ceiling
	clampInt := func(v *int64, top int64) {
		if top > 0 && (*v == 0 || *v > top) {
			*v = top
		}
	}
	clampInt(&l.MemoryBytes, c.MemoryBytes)
	clampInt(&l.Pids, c.Pids)
	clampInt(&l.FileSizeBytes, c.FileSizeBytes)
	clampInt(&l.DiskBytes, c.DiskBytes)
	if c.CPUs > 0 && (l.CPUs == 0 || l.CPUs > c.CPUs) {
		l.CPUs = c.CPUs
	}
	clampInt(&l.OutputBytes, s.o.maxOutput)
	l.Timeout = timeout
	return l.WithDefaults()
}

// maxLimits is what the capabilities reply shows of the ceilings: a zero
// field has none.
func (s *Server) maxLimits() policy.ResourceLimits {
	l := s.o.ceiling
	l.OutputBytes = s.o.maxOutput
	return l
}

// WithCleanupInterval sets how often retention cleanup runs.
func WithCleanupInterval(d time.Duration) Option {
	return func(o *options) error { o.cleanupInterval = d; return nil }
}

// WithUploadGrace sets how long reconcile leaves an uploaded workspace
// whose execution was not submitted yet (default 1 hour).
func WithUploadGrace(d time.Duration) Option {
	return func(o *options) error { o.uploadGrace = d; return nil }
}

// WithPingInterval sets the WebSocket keepalive interval (default 20s).
func WithPingInterval(d time.Duration) Option {
	return func(o *options) error { o.pingInterval = d; return nil }
}

// WithLease sets the lease a replica holds in a shared store
// (store.Leaser; default DefaultLease). It is renewed every third of d;
// a replica that misses renewals for d counts as dead, and another
// replica marks its running executions UNKNOWN, saying why.
func WithLease(d time.Duration) Option {
	return func(o *options) error {
		if d < 100*time.Millisecond {
			return fmt.Errorf("lease %v under 100ms: %w", d, ErrConfig)
		}
		o.lease = d
		return nil
	}
}

// WithLogger sets the structured logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) error { o.log = l; return nil } }

// Server is the pulse-server runtime: the WebSocket API over an executor
// and a store. Create it with New, serve Handler on a listener, and call
// Shutdown to stop.
type Server struct {
	o     options
	exec  Executor
	store store.Interface
	auth  *authenticator
	log   *slog.Logger
	m     *metrics

	ctx    context.Context // lives until Shutdown gives up waiting
	cancel context.CancelFunc

	ready    atomic.Bool
	draining atomic.Bool

	mu     sync.Mutex
	active map[string]*execution // running, by execution id
	slots  int                   // executions holding a concurrency slot
	conns  map[*conn]struct{}
	closed bool           // Shutdown closed the connections; refuse new ones
	wg     sync.WaitGroup // executions and background loops
	// idLocks order upload, submit and reconcile decisions on one
	// execution id, striped so that a large upload does not hold up
	// submissions of other ids.
	idLocks [64]sync.Mutex
}

// New builds a server over exec and st. It marks executions a previous
// process left RUNNING as UNKNOWN before returning, so nothing is ever
// replayed, and starts retention cleanup. The server is ready once New
// returns.
func New(ctx context.Context, exec Executor, st store.Interface, opts ...Option) (*Server, error) {
	o := options{
		maxConcurrent:   DefaultMaxConcurrent,
		retention:       DefaultRetention,
		maxMessage:      DefaultMaxMessageBytes,
		outboxBytes:     DefaultOutboxBytes,
		network:         policy.DenyAllNetwork(),
		secrets:         secrets.DenyAllSecrets(),
		maxOutput:       policy.DefaultOutputBytes,
		cleanupInterval: DefaultCleanupInterval,
		uploadGrace:     DefaultUploadGrace,
		cancelWait:      DefaultCancelWait,
		pingInterval:    DefaultPingInterval,
		lease:           DefaultLease,
		now:             time.Now,
	}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if exec == nil || st == nil {
		return nil, fmt.Errorf("executor and store are required: %w", ErrConfig)
	}
	if len(o.tokens) == 0 {
		return nil, fmt.Errorf("PULSE_REMOTE_TOKEN must hold at least one token; insecure defaults are disabled: %w", ErrConfig)
	}
	if o.production {
		for _, t := range o.tokens {
			if err := CheckTokenStrength(t); err != nil {
				return nil, fmt.Errorf("every production token must be random, non-placeholder and at least %d characters: %w: %w", MinTokenLen, err, ErrConfig)
			}
		}
	}
	if o.workspaceRoot == "" {
		return nil, fmt.Errorf("workspace root is required: %w", ErrConfig)
	}
	root, err := filepath.Abs(o.workspaceRoot)
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	o.workspaceRoot = root
	leaser, _ := st.(store.Leaser)
	if leaser != nil {
		// Before anything is created: a record must never be RUNNING
		// under a replica with no lease, or no one would sweep it.
		if _, err := leaser.RenewLease(ctx, o.lease); err != nil {
			return nil, err
		}
	}
	n, err := st.MarkRunningUnknown(ctx)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		o.log.Warn("marked interrupted executions UNKNOWN", "count", n)
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		o: o, exec: exec, store: st, auth: newAuthenticator(o.tokens), log: o.log,
		m: newMetrics(), ctx: sctx, cancel: cancel,
		active: map[string]*execution{}, conns: map[*conn]struct{}{},
	}
	// An executor that keeps a fleet of workers (the relay) says how many
	// are attached.
	if f, ok := exec.(interface {
		Workers() (live, capacity, busy int)
	}); ok {
		s.m.workers = f.Workers
	}
	s.wg.Add(1)
	go s.cleanupLoop()
	if leaser != nil {
		s.wg.Add(1)
		go s.leaseLoop(leaser)
	}
	s.ready.Store(true)
	return s, nil
}

// Executor returns the server's executor.
func (s *Server) Executor() Executor { return s.exec }

// Handler serves /healthz, /readyz, /metrics and the WebSocket API on
// every other path.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	s.handleHealth(mux)
	mux.HandleFunc("/metrics", s.serveMetrics)
	mux.HandleFunc("/", s.serveWS)
	return mux
}

// HealthHandler serves /healthz and /readyz alone. It is meant for a
// plain-HTTP listener of its own (pulse-server --health-listen): a
// kubelet's probe presents no client certificate, so it cannot reach the
// mutual-TLS API listener, and a bare TCP check says nothing about the
// store or a drain. Neither answer holds anything a tenant could use.
func (s *Server) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	s.handleHealth(mux)
	return mux
}

func (s *Server) handleHealth(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, true)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ok := s.ready.Load() && !s.draining.Load()
		if ok {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			ok = s.store.Ping(ctx) == nil
			cancel()
		}
		writeHealth(w, ok)
	})
}

func writeHealth(w http.ResponseWriter, ok bool) {
	w.Header().Set("Content-Type", "application/json")
	if ok {
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"status":"ok"}`))
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte(`{"status":"not_ready"}`))
}

// Shutdown stops taking submissions, lets running executions finish until
// ctx is done, then cancels what is left and waits for it to be recorded.
// Connections are closed last, so clients receive every result that was
// produced. Shutdown is idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	// Under s.mu: a handler that checks it there and then adds to s.wg
	// (reconcile) does so before the Wait below, or not at all.
	s.mu.Lock()
	s.draining.Store(true)
	s.mu.Unlock()
	s.ready.Store(false)
	done := make(chan struct{})
	go func() {
		for {
			// Slots, not active executions: a submit that took its slot
			// before draining was set is not active until it registers,
			// and its s.wg.Add comes after that; Wait must not start
			// before it has.
			s.mu.Lock()
			n := s.slots
			s.mu.Unlock()
			if n == 0 {
				close(done)
				return
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-s.ctx.Done():
				// Cancelled executions still finish their bookkeeping.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		s.cancel()
		<-done
	}
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	s.closed = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.shutdown()
	}
	return err
}

func (s *Server) idLock(id string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(id))
	return &s.idLocks[h.Sum32()%uint32(len(s.idLocks))]
}

// tenantDir is where a tenant's workspaces live.
func (s *Server) tenantDir(tenant string) string {
	return filepath.Join(s.o.workspaceRoot, tenant)
}

func (s *Server) workspaceDir(tenant, id string) string {
	return filepath.Join(s.tenantDir(tenant), id)
}

// overlayFile is where the overlay archive of an execution is kept. The
// directory name starts with a dot, which no execution id can, so it can
// never be taken for a workspace.
func (s *Server) overlayFile(tenant, id string) string {
	return filepath.Join(s.tenantDir(tenant), ".overlays", id+".tar.gz")
}

// leaseLoop renews this replica's lease and sweeps the executions of
// replicas whose lease expired, every third of the lease, until the
// server's context ends. A sweep lands in the store, where a client
// following a swept execution (attach on this or any replica) reads it.
func (s *Server) leaseLoop(l store.Leaser) {
	defer s.wg.Done()
	t := time.NewTicker(s.o.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.o.lease/3)
		lost, err := l.RenewLease(ctx, s.o.lease)
		switch {
		case err != nil:
			s.log.Error("lease not renewed; another replica may take this one for dead", "err", err)
		case lost:
			s.log.Error("this replica's lease had expired; another replica may have marked its running executions UNKNOWN")
		}
		refs, err := l.SweepExpired(ctx)
		cancel()
		if err != nil {
			s.log.Error("sweeping the executions of dead replicas", "err", err)
			continue
		}
		for _, r := range refs {
			s.log.Warn("execution of a dead replica marked UNKNOWN", "execution_id", r.ExecutionID, "tenant", r.Tenant)
		}
	}
}

func (s *Server) cleanupLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.o.cleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.cleanupOnce(s.ctx)
		}
	}
}

// cleanupOnce deletes terminal records older than the retention, their
// workspaces and overlays.
func (s *Server) cleanupOnce(ctx context.Context) {
	refs, err := s.store.CleanupOld(ctx, s.o.now().Add(-s.o.retention))
	if err != nil {
		s.log.Error("retention cleanup failed", "err", err)
		return
	}
	for _, r := range refs {
		s.removeWorkspace(r.Tenant, r.ExecutionID)
		os.Remove(s.overlayFile(r.Tenant, r.ExecutionID))
	}
	abandoned := s.removeAbandonedUploads(ctx)
	if len(refs) > 0 || abandoned > 0 {
		s.log.Info("retention cleanup", "removed", len(refs), "abandoned_uploads", abandoned)
	}
}

// removeAbandonedUploads deletes workspaces uploaded for executions that
// were never submitted, once they are older than the retention, so that a
// client that never reconciles cannot fill the disk.
func (s *Server) removeAbandonedUploads(ctx context.Context) int {
	tenants, err := os.ReadDir(s.o.workspaceRoot)
	if err != nil {
		return 0
	}
	cutoff := s.o.now().Add(-s.o.retention)
	n := 0
	for _, t := range tenants {
		if !t.IsDir() {
			continue
		}
		entries, err := os.ReadDir(s.tenantDir(t.Name()))
		if err != nil {
			continue
		}
		for _, ent := range entries {
			id := ent.Name()
			info, err := ent.Info()
			if !ent.IsDir() || !protocol.ValidID(id) || err != nil || !info.ModTime().Before(cutoff) {
				continue
			}
			lk := s.idLock(id)
			lk.Lock()
			taken, err := s.store.Exists(ctx, id)
			if err == nil && !taken && s.lookup(id, t.Name()) == nil {
				s.removeWorkspace(t.Name(), id)
				n++
			}
			lk.Unlock()
		}
		s.removeOrphanOverlays(ctx, t.Name(), cutoff)
	}
	return n
}

// removeOrphanOverlays deletes the overlays of tenant older than cutoff
// whose record is gone. On one server the record's cleanup removes its
// overlay; with replicas sharing a store, another replica's cleanup may
// have deleted the record, and the overlay on this one's disk would stay
// for ever.
func (s *Server) removeOrphanOverlays(ctx context.Context, tenant string, cutoff time.Time) {
	dir := filepath.Dir(s.overlayFile(tenant, "x"))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, ent := range entries {
		id, ok := strings.CutSuffix(ent.Name(), ".tar.gz")
		info, err := ent.Info()
		if !ok || !ent.Type().IsRegular() || !protocol.ValidID(id) || err != nil || !info.ModTime().Before(cutoff) {
			continue
		}
		lk := s.idLock(id)
		lk.Lock()
		if taken, err := s.store.Exists(ctx, id); err == nil && !taken && s.lookup(id, tenant) == nil {
			os.Remove(filepath.Join(dir, ent.Name()))
		}
		lk.Unlock()
	}
}

func (s *Server) removeWorkspace(tenant, id string) {
	if !protocol.ValidID(id) {
		return
	}
	if err := os.RemoveAll(s.workspaceDir(tenant, id)); err != nil {
		s.log.Warn("remove workspace", "execution_id", id, "err", err)
	}
}
