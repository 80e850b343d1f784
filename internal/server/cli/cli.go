// Package cli is pulse-server's command line, importable so that tests
// run the real server — flags, environment, start-up checks, the choice
// of executor, the listener, the drain at shutdown — rather than a
// stand-in: cmd/pulse-server's main is Run with the process's arguments,
// environment and standard streams.
//
// Configuration comes from the environment variables of the Python server
// it replaces (PULSE_REMOTE_TOKEN, PULSE_REMOTE_HOST, PULSE_REMOTE_PORT,
// PULSE_REMOTE_WORKSPACE_ROOT, PULSE_REMOTE_DB, PULSE_REMOTE_MAX_CONCURRENCY,
// PULSE_REMOTE_RETENTION_HOURS, PULSE_TLS_CERT/KEY/CA) and flags of the same
// meaning. The end of Run's ctx drains it: no new submissions, running ones
// get a grace period, then are cancelled and recorded.
package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

// Exit codes of Run.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// Env is what Run takes from its process.
type Env struct {
	// Getenv reads the environment (os.Getenv for the real server).
	Getenv func(string) string
	// Stdout and Stderr take --version and usage, and the JSON log.
	Stdout, Stderr io.Writer
	// Version is what --version prints and the log says ("dev" when
	// empty).
	Version string
	// OnListen, when set, learns the bound addresses once the server
	// listens (tests listen on port 0).
	OnListen func(api, workers string)
	// OnHealthListen, when set, learns the address of --health-listen
	// once it listens.
	OnHealthListen func(addr string)
}

type config struct {
	host, port           string
	workspaceRoot, db    string
	replicaID            string
	maxConcurrency       int
	retentionHours       int
	development          bool
	executor             string
	backendName          string
	unsafeHost           bool
	workerListen         string
	healthListen         string
	workerTokens         string
	drain                time.Duration
	lease                time.Duration
	logLevel             string
	tlsCert, tlsKey, tca string
	clientTokens         string // PULSE_REMOTE_TOKEN
	// ceiling bounds the resource limits a submission may ask for.
	ceiling policy.ResourceLimits
	// uploads bound one uploaded workspace; maxOutput caps each of stdout
	// and stderr of one execution.
	uploads   protocol.ArchiveLimits
	maxOutput int64
	version   string
}

// maxSecretFile bounds a token file: a token list is a few hundred bytes,
// and a path pointing at something else by mistake must not be slurped.
const maxSecretFile = 64 << 10

// secretEnv reads a secret from the variable name or, as Kubernetes and
// Docker secrets are mounted, from the file that name_FILE points to, so
// the value need not sit in the process environment (which `ps e` and
// /proc/<pid>/environ show to the same user). Setting both is refused
// rather than guessed between. Trailing whitespace (the newline an editor
// or `kubectl create secret --from-file` leaves) is dropped.
func secretEnv(getenv func(string) string, name string) (string, error) {
	v, path := getenv(name), getenv(name+"_FILE")
	if path == "" {
		return v, nil
	}
	if v != "" {
		return "", fmt.Errorf("%s and %s_FILE are both set; set one", name, name)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s_FILE: %w", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("%s_FILE: %w", name, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s_FILE %s is larger than %d bytes; is it the token file?", name, path, maxSecretFile)
	}
	return strings.TrimRight(string(b), " \t\r\n"), nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func envInt(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		// def keeps later checks quiet about a value already reported.
		return def, fmt.Errorf("%s=%q is not an integer", name, v)
	}
	return n, nil
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// Run is pulse-server: it parses args (flags) and env's environment,
// reports every start-up problem at once (ExitUsage), then serves until
// ctx ends and drains (ExitOK), or fails (ExitFailure).
func Run(ctx context.Context, args []string, env Env) int {
	getenv, stdout, stderr := env.Getenv, env.Stdout, env.Stderr
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if env.Version == "" {
		env.Version = "dev"
	}
	if len(args) > 0 && args[0] == "migrate-store" {
		return migrateStore(ctx, args[1:], getenv, stdout, stderr)
	}
	fs := flag.NewFlagSet("pulse-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	// Every start-up problem is collected and reported at once, so that a
	// new user fixes them in one round instead of one per attempt.
	var problems []string
	maxConc, err := envInt(getenv, "PULSE_REMOTE_MAX_CONCURRENCY", server.DefaultMaxConcurrent)
	if err != nil {
		problems = append(problems, err.Error())
	}
	retention, err := envInt(getenv, "PULSE_REMOTE_RETENTION_HOURS", 24)
	if err != nil {
		problems = append(problems, err.Error())
	}
	maxUpload, err := envInt(getenv, "PULSE_REMOTE_MAX_UPLOAD_BYTES", int(protocol.DefaultMaxCompressed))
	if err != nil {
		problems = append(problems, err.Error())
	}
	maxUnpacked, err := envInt(getenv, "PULSE_REMOTE_MAX_UNPACKED_BYTES", int(protocol.DefaultMaxUnpacked))
	if err != nil {
		problems = append(problems, err.Error())
	}
	maxOutput, err := envInt(getenv, "PULSE_REMOTE_MAX_OUTPUT_BYTES", int(policy.DefaultOutputBytes))
	if err != nil {
		problems = append(problems, err.Error())
	}
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.StringVar(&c.host, "host", envOr(getenv, "PULSE_REMOTE_HOST", "127.0.0.1"), "bind host (PULSE_REMOTE_HOST)")
	fs.StringVar(&c.port, "port", envOr(getenv, "PULSE_REMOTE_PORT", "8080"), "bind port (PULSE_REMOTE_PORT)")
	fs.StringVar(&c.workspaceRoot, "workspace-root", envOr(getenv, "PULSE_REMOTE_WORKSPACE_ROOT", ".pulse/remote-workspaces"), "tenant workspace root (PULSE_REMOTE_WORKSPACE_ROOT)")
	// The database's default is not shown as the flag's: a Postgres URL
	// may hold a password, and -help must not print it.
	fs.StringVar(&c.db, "database", "", "durable execution database: a SQLite file, or a postgres:// URL that several replicas share (default PULSE_REMOTE_DB, or the file PULSE_REMOTE_DB_FILE names, else "+defaultDB+"); pulse-server migrate-store copies a SQLite database into Postgres")
	fs.StringVar(&c.replicaID, "replica-id", getenv("PULSE_REPLICA_ID"), "this server's name among replicas sharing a Postgres database; it quarantines only its own interrupted executions at start (PULSE_REPLICA_ID; default: the host name with Postgres, none with SQLite)")
	fs.IntVar(&c.maxConcurrency, "max-concurrency", maxConc, "maximum active executions, 1-128 (PULSE_REMOTE_MAX_CONCURRENCY)")
	fs.IntVar(&c.retentionHours, "retention-hours", retention, "retention of terminal execution records, 1-8760 hours (PULSE_REMOTE_RETENTION_HOURS)")
	fs.BoolVar(&c.development, "development", false, "allow short development tokens and relative paths; loopback only")
	fs.StringVar(&c.executor, "executor", envOr(getenv, "PULSE_SERVER_EXECUTOR", "local"), "local (embedded backend) or relay (pulse-workers over gRPC)")
	fs.StringVar(&c.backendName, "backend", envOr(getenv, "PULSE_SERVER_BACKEND", "auto"), "local backend: auto, docker, namespace or host")
	fs.BoolVar(&c.unsafeHost, "unsafe-host", false, "allow the host backend: commands run unisolated on this machine")
	fs.StringVar(&c.workerListen, "worker-listen", getenv("PULSE_WORKER_LISTEN"), "gRPC address pulse-workers attach to (relay executor)")
	fs.StringVar(&c.workerTokens, "worker-token", "", "worker bearer tokens, comma-separated (default PULSE_WORKER_TOKEN)")
	fs.DurationVar(&c.drain, "drain-timeout", 30*time.Second, "how long running executions may finish at shutdown")
	fs.DurationVar(&c.lease, "replica-lease", server.DefaultLease, "with a Postgres database: how long this replica stays alive in it without renewing (every third of it); the running executions of a replica whose lease expired are marked UNKNOWN by another")
	fs.Int64Var(&c.ceiling.MemoryBytes, "max-memory-bytes", 0, "largest memory limit of one execution; also applied to those that set none (0: no ceiling)")
	fs.Float64Var(&c.ceiling.CPUs, "max-cpus", 0, "largest CPU limit of one execution, in cores (0: no ceiling)")
	fs.Int64Var(&c.ceiling.Pids, "max-pids", 0, "largest process count limit of one execution (0: no ceiling)")
	fs.Int64Var(&c.ceiling.FileSizeBytes, "max-file-size-bytes", 0, "largest file-size limit of one execution (0: no ceiling)")
	fs.Int64Var(&c.uploads.MaxCompressed, "max-upload-bytes", int64(maxUpload), "largest uploaded workspace archive, compressed (PULSE_REMOTE_MAX_UPLOAD_BYTES)")
	fs.Int64Var(&c.uploads.MaxUnpacked, "max-unpacked-bytes", int64(maxUnpacked), "largest uploaded workspace, unpacked (PULSE_REMOTE_MAX_UNPACKED_BYTES)")
	fs.Int64Var(&c.maxOutput, "max-output-bytes", int64(maxOutput), "output cap of each of stdout and stderr of one execution (PULSE_REMOTE_MAX_OUTPUT_BYTES)")
	fs.StringVar(&c.healthListen, "health-listen", getenv("PULSE_HEALTH_LISTEN"), "plain-HTTP address serving only /healthz and /readyz, for probes that hold no client certificate (PULSE_HEALTH_LISTEN)")
	fs.StringVar(&c.logLevel, "log-level", envOr(getenv, "PULSE_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if *showVersion {
		fmt.Fprintf(stdout, "pulse-server %s\n", env.Version)
		return ExitOK
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pulse-server: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	}
	if c.workerTokens == "" {
		if c.workerTokens, err = secretEnv(getenv, "PULSE_WORKER_TOKEN"); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if c.db == "" {
		if c.db, err = secretEnv(getenv, "PULSE_REMOTE_DB"); err != nil {
			problems = append(problems, err.Error())
		}
		if c.db == "" {
			c.db = defaultDB
		}
	}
	if c.replicaID == "" && store.IsPostgresURL(c.db) {
		if c.replicaID, err = os.Hostname(); err != nil || c.replicaID == "" {
			problems = append(problems, "--replica-id is needed with a Postgres database: the host name is unknown")
		}
	}
	c.tlsCert, c.tlsKey, c.tca = getenv("PULSE_TLS_CERT"), getenv("PULSE_TLS_KEY"), getenv("PULSE_TLS_CA")
	if c.clientTokens, err = secretEnv(getenv, "PULSE_REMOTE_TOKEN"); err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, c.check()...)
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		problems = append(problems, fmt.Sprintf("--log-level: %v", err))
	}
	if len(problems) > 0 {
		reportProblems(stderr, problems)
		return ExitUsage
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	c.version = env.Version
	if err := serve(ctx, &c, log, env); err != nil {
		log.Error("pulse-server failed", "err", err)
		fmt.Fprintf(stderr, "pulse-server: %v\n", err)
		return ExitFailure
	}
	return ExitOK
}

// defaultDB is the SQLite database of a server given none.
const defaultDB = ".pulse/remote-executions.sqlite3"

// localTryHint ends every start-up refusal: the shortest way to see the
// server run at all.
const localTryHint = "for a local try: PULSE_REMOTE_TOKEN=dev pulse-server --development"

// reportProblems prints every start-up problem, one a line, then the hint.
func reportProblems(w io.Writer, problems []string) {
	fmt.Fprintf(w, "pulse-server: cannot start (%d problem", len(problems))
	if len(problems) > 1 {
		fmt.Fprint(w, "s")
	}
	fmt.Fprintln(w, "):")
	for _, p := range problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
	fmt.Fprintln(w, localTryHint)
}

// check applies the Python server's start-up rules and returns every
// problem found, or none.
func (c *config) check() []string {
	var problems []string
	add := func(msg string) { problems = append(problems, msg) }
	if c.development && !isLoopback(c.host) {
		add("--development is restricted to a loopback host")
	}
	// The token rules are server.New's; checking them here lets them be
	// reported together with the others instead of after the rest passed.
	switch tokens := server.ParseTokens(c.clientTokens); {
	case len(tokens) == 0:
		add("PULSE_REMOTE_TOKEN is not set: clients need a bearer token (comma-separated for several)")
	case !c.development:
		for i, t := range tokens {
			if err := server.CheckTokenStrength(t); err != nil {
				add(fmt.Sprintf("PULSE_REMOTE_TOKEN token %d of %d is weak (%v); generate one with: openssl rand -hex 32", i+1, len(tokens), err))
			}
		}
	}
	isURL := store.IsPostgresURL(c.db)
	if !c.development && (!filepath.IsAbs(c.workspaceRoot) || !isURL && !filepath.IsAbs(c.db)) {
		add("production remote paths must be absolute; set PULSE_REMOTE_WORKSPACE_ROOT and PULSE_REMOTE_DB")
	}
	if scheme, _, ok := strings.Cut(c.db, "://"); ok && !isURL && !strings.ContainsAny(scheme, `/\`) {
		add(fmt.Sprintf("--database: %q URLs are not supported; give a SQLite path or a postgres:// URL", scheme))
	}
	fileOK := func(v string) bool {
		info, err := os.Stat(v)
		return v != "" && filepath.IsAbs(v) && err == nil && info.Mode().IsRegular()
	}
	tlsVars := [][2]string{{"PULSE_TLS_CERT", c.tlsCert}, {"PULSE_TLS_KEY", c.tlsKey}, {"PULSE_TLS_CA", c.tca}}
	for _, v := range tlsVars {
		// Off loopback, mutual TLS is mandatory, as it was for the Python
		// server; on loopback TLS is optional but must be whole.
		required := !isLoopback(c.host) || (v[0] != "PULSE_TLS_CA" && (c.tlsCert != "" || c.tlsKey != "")) || v[1] != ""
		if required && !fileOK(v[1]) {
			add(v[0] + " must reference an existing absolute file for a non-loopback server")
		}
	}
	if c.maxConcurrency < 1 || c.maxConcurrency > server.MaxConcurrentLimit {
		add("--max-concurrency must be between 1 and 128")
	}
	if c.retentionHours < 1 || c.retentionHours > 8760 {
		add("--retention-hours must be between 1 and 8760")
	}
	if c.uploads.MaxCompressed < 1<<10 || c.uploads.MaxUnpacked < c.uploads.MaxCompressed {
		add("--max-upload-bytes must be at least 1024 and --max-unpacked-bytes at least as large")
	}
	if c.maxOutput < 1<<10 {
		add("--max-output-bytes must be at least 1024")
	}
	if l := c.ceiling; l.MemoryBytes < 0 || l.Pids < 0 || l.FileSizeBytes < 0 || !(l.CPUs >= 0) {
		add("--max-memory-bytes, --max-cpus, --max-pids and --max-file-size-bytes must not be negative")
	}
	switch c.executor {
	case "local":
		if c.workerListen != "" {
			add("--worker-listen needs --executor relay")
		}
	case "relay":
		if c.workerListen == "" {
			add("--executor relay needs --worker-listen (PULSE_WORKER_LISTEN)")
		}
		if len(server.ParseTokens(c.workerTokens)) == 0 {
			add("--executor relay needs worker tokens (PULSE_WORKER_TOKEN)")
		}
		if c.workerListen != "" {
			if host, _, err := net.SplitHostPort(c.workerListen); err != nil {
				add("--worker-listen: " + err.Error())
			} else if !isLoopback(host) && (c.tlsCert == "" || c.tlsKey == "") {
				add("a non-loopback --worker-listen needs PULSE_TLS_CERT and PULSE_TLS_KEY")
			}
		}
	default:
		add("--executor must be local or relay")
	}
	switch c.backendName {
	case "auto", "docker", "namespace":
	case "host":
		if !c.unsafeHost {
			add("--backend host needs --unsafe-host: commands would run unisolated on this machine")
		}
	default:
		add("--backend must be auto, docker, namespace or host")
	}
	return problems
}

// tlsConfig builds the listener TLS: server certificate, and client
// certificates required and verified against the CA when one is given.
func (c *config) tlsConfig() (*tls.Config, error) {
	if c.tlsCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.tca != "" {
		pem, err := os.ReadFile(c.tca)
		if err != nil {
			return nil, fmt.Errorf("read TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA %s holds no certificate", c.tca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// localBackend picks the embedded backend as the facade does: Docker,
// then namespaces, then the host only when explicitly allowed.
func localBackend(ctx context.Context, c *config, log *slog.Logger) (backend.Backend, error) {
	type cand struct {
		name string
		make func() (backend.Backend, error)
	}
	all := []cand{
		{"docker", func() (backend.Backend, error) { return docker.New(docker.WithLogger(log)) }},
		{"namespace", func() (backend.Backend, error) { return namespace.New(namespace.WithLogger(log)) }},
		{"host", func() (backend.Backend, error) { return host.New(host.WithLogger(log)) }},
	}
	var why []string
	for _, cd := range all {
		if c.backendName != "auto" && c.backendName != cd.name {
			continue
		}
		if cd.name == "host" && !c.unsafeHost {
			why = append(why, "host: not allowed without --unsafe-host")
			continue
		}
		b, err := cd.make()
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = b.Probe(pctx)
			cancel()
			if err == nil {
				return b, nil
			}
			b.Close()
		}
		why = append(why, cd.name+": "+err.Error())
	}
	return nil, fmt.Errorf("no local backend available:\n  %s", strings.Join(why, "\n  "))
}

func serve(ctx context.Context, c *config, log *slog.Logger, env Env) error {
	tlsCfg, err := c.tlsConfig()
	if err != nil {
		return err
	}
	st, err := store.OpenDatabase(ctx, c.db, store.WithReplica(c.replicaID))
	if err != nil {
		return err
	}
	defer st.Close()
	log.Info("execution store open", "database", store.Redact(c.db), "replica", c.replicaID)

	var exec server.Executor
	var workers *relay.Relay
	opts := []server.Option{
		server.WithTokens(server.ParseTokens(c.clientTokens)...),
		server.WithProduction(!c.development),
		server.WithMaxConcurrent(c.maxConcurrency),
		server.WithWorkspaceRoot(c.workspaceRoot),
		server.WithRetention(time.Duration(c.retentionHours) * time.Hour),
		server.WithLogger(log),
		server.WithLimitCeiling(c.ceiling),
		server.WithArtifactLimits(c.uploads),
		server.WithMaxOutputBytes(c.maxOutput),
		server.WithLease(c.lease),
	}
	// An upload travels base64-encoded in one frame: the frame limit
	// grows with the upload limit.
	if frame := c.uploads.MaxCompressed/3*4 + 1<<20; frame > server.DefaultMaxMessageBytes {
		opts = append(opts, server.WithMaxMessageBytes(frame))
	}
	switch c.executor {
	case "relay":
		workers, err = relay.New(server.ParseTokens(c.workerTokens), relay.WithLogger(log))
		if err != nil {
			return err
		}
		exec = workers
		opts = append(opts, server.WithDefaultPolicies(policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.DenyAllSecrets()))
	default:
		b, err := localBackend(ctx, c, log)
		if err != nil {
			return err
		}
		defer b.Close()
		// What a previous server left running when it was killed (its
		// commands, and on the host backend everything they started) is
		// ended now, not when a client happens to ask for a reconcile.
		if err := b.Reconcile(ctx); err != nil {
			log.Warn("reconciling what an earlier run left behind", "error", err)
		}
		if b.Name() == host.Name {
			log.Warn("UNSAFE_HOST: commands run unisolated on this machine, with its network")
			// The host cannot deny the network; the operator chose that.
			opts = append(opts, server.WithDefaultPolicies(policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.DenyAllSecrets()))
		}
		exec = server.NewLocal(b, 0, log)
	}
	srv, err := server.New(ctx, exec, st, opts...)
	if err != nil {
		return err
	}

	lis, err := net.Listen("tcp", net.JoinHostPort(c.host, c.port))
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	scheme := "ws"
	if tlsCfg != nil {
		hs.TLSConfig = tlsCfg
		lis = tls.NewListener(lis, tlsCfg)
		scheme = "wss"
	} else {
		log.Warn("starting in insecure loopback mode without TLS")
	}
	errc := make(chan error, 3)
	go func() { errc <- hs.Serve(lis) }()

	if c.healthListen != "" {
		hl, err := net.Listen("tcp", c.healthListen)
		if err != nil {
			hs.Close()
			return fmt.Errorf("--health-listen: %w", err)
		}
		health := &http.Server{Handler: srv.HealthHandler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() { errc <- health.Serve(hl) }()
		defer health.Close()
		log.Info("health endpoints listening", "url", fmt.Sprintf("http://%s/readyz", hl.Addr()))
		if env.OnHealthListen != nil {
			env.OnHealthListen(hl.Addr().String())
		}
	}

	var gs *grpc.Server
	workerAddr := ""
	if workers != nil {
		wl, err := net.Listen("tcp", c.workerListen)
		if err != nil {
			hs.Close()
			return err
		}
		gopts := []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true})}
		if tlsCfg != nil {
			// Workers authenticate with their bearer token, not a client
			// certificate: the worker listener is TLS without mTLS.
			wcfg := tlsCfg.Clone()
			wcfg.ClientAuth, wcfg.ClientCAs = tls.NoClientCert, nil
			gopts = append(gopts, grpc.Creds(credentials.NewTLS(wcfg)))
		}
		gs = grpc.NewServer(gopts...)
		workers.Register(gs)
		workerAddr = wl.Addr().String()
		go func() { errc <- gs.Serve(wl) }()
		log.Info("worker relay listening", "addr", workerAddr)
	}
	log.Info("pulse-server listening", "url", fmt.Sprintf("%s://%s", scheme, lis.Addr()), "executor", exec.Name(), "version", c.version)
	if env.OnListen != nil {
		env.OnListen(lis.Addr().String(), workerAddr)
	}

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case serveErr = <-errc:
	}
	dctx, cancel := context.WithTimeout(context.Background(), c.drain)
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil {
		log.Warn("drain timed out; running executions were cancelled", "err", err)
	}
	sctx, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	hs.Shutdown(sctx)
	if gs != nil {
		gs.Stop()
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// migrateStore is `pulse-server migrate-store --from FILE --to URL`: it
// copies a SQLite database's records and events into Postgres, for a
// server that grows into several replicas. It can run again after an
// interruption; what was copied is skipped.
func migrateStore(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pulse-server migrate-store", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "", "the SQLite database to copy; stop every server using it first")
	to := fs.String("to", "", "the postgres:// URL to copy into (default PULSE_REMOTE_DB, or the file PULSE_REMOTE_DB_FILE names, when it is one)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	var problems []string
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	if *to == "" {
		v, err := secretEnv(getenv, "PULSE_REMOTE_DB")
		if err != nil {
			problems = append(problems, err.Error())
		}
		if store.IsPostgresURL(v) {
			*to = v
		}
	}
	if !store.IsPostgresURL(*to) {
		problems = append(problems, "--to must be a postgres:// URL (or PULSE_REMOTE_DB one)")
	}
	// Opening a missing SQLite file would create an empty one and move
	// nothing, silently.
	if info, err := os.Stat(*from); *from == "" || err != nil || !info.Mode().IsRegular() {
		problems = append(problems, "--from must name an existing SQLite database file")
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "pulse-server migrate-store: %s\n", strings.Join(problems, "; "))
		return ExitUsage
	}
	src, err := store.Open(ctx, *from)
	if err != nil {
		fmt.Fprintf(stderr, "pulse-server migrate-store: %v\n", err)
		return ExitFailure
	}
	defer src.Close()
	dst, err := store.OpenPostgres(ctx, *to)
	if err != nil {
		fmt.Fprintf(stderr, "pulse-server migrate-store: %v\n", err)
		return ExitFailure
	}
	defer dst.Close()
	st, err := store.MoveSQLiteToPostgres(ctx, dst, src)
	if err != nil {
		fmt.Fprintf(stderr, "pulse-server migrate-store: %v (run it again to go on: what was copied is skipped)\n", err)
		return ExitFailure
	}
	fmt.Fprintf(stdout, "moved %d executions with %d events from %s to %s (%d were there already; %d interrupted ones arrive UNKNOWN)\n",
		st.Executions, st.Events, *from, store.Redact(*to), st.Skipped, st.Quarantined)
	return ExitOK
}
