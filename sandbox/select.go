package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/backend/remote"
)

// probeTimeout bounds each backend's Probe during selection, so that an
// engine that does not answer cannot stall New.
const probeTimeout = 10 * time.Second

// candidate is one backend the selection may try, in order.
type candidate struct {
	name string
	// skip says why the candidate is not even tried ("" = try it).
	skip func(o *options) string
	make func(o *options) (backend.Backend, error)
}

// Candidates in DESIGN order: remote, docker, namespace, host (opt-in).
func candidates() []candidate {
	return []candidate{
		{
			name: "remote",
			skip: func(o *options) string {
				if strings.TrimSpace(o.getenv("PULSE_REMOTE_URL")) == "" {
					return "PULSE_REMOTE_URL is not set"
				}
				return ""
			},
			make: func(o *options) (backend.Backend, error) {
				return remote.FromEnv(o.getenv, append([]remote.Option{remote.WithLogger(o.logger)}, o.remoteOpts...)...)
			},
		},
		{
			name: "docker",
			make: func(o *options) (backend.Backend, error) {
				// Docker sets memory, cpu and pids limits on the container,
				// not per command: the sandbox's limits become the
				// container's, so that they are enforced, not dropped.
				opts := []docker.Option{docker.WithLogger(o.logger), docker.WithSessionID(o.sessionID)}
				if ref := o.dockerImage(); ref != "" {
					opts = append(opts, docker.WithImage(ref))
				}
				if o.limits != nil {
					opts = append(opts, docker.WithContainerLimits(*o.limits))
				}
				if o.keepWarm > 0 {
					opts = append(opts, docker.WithReuse(o.keepWarm))
				}
				return docker.New(opts...)
			},
		},
		{
			name: "namespace",
			make: func(o *options) (backend.Backend, error) {
				opts := []namespace.Option{namespace.WithLogger(o.logger)}
				if f := o.probeCacheFile("namespace"); f != "" {
					opts = append(opts, namespace.WithProbeCache(f))
				}
				if o.noPrestart {
					opts = append(opts, namespace.WithoutPrestart())
				}
				if o.keepWarm > 0 {
					opts = append(opts, namespace.WithKeeper(o.keepWarm))
				}
				return namespace.New(opts...)
			},
		},
		{
			name: "host",
			skip: func(o *options) string {
				if !o.unsafeHost {
					return "not allowed: commands would run unisolated on this machine " +
						"(opt in with WithUnsafeHostExecution, or `pulse exec --unsafe-host`)"
				}
				return ""
			},
			make: func(o *options) (backend.Backend, error) {
				return host.New(host.WithLogger(o.logger))
			},
		},
	}
}

// WithoutPrestart says the sandbox runs one command and is closed (a CLI
// process): backends start nothing ahead for a next command, which would
// only be ended unused at Close. Without it the namespace backend keeps an
// init ready after each command, which halves the latency of the next.
// It applies to the backends the sandbox selects, not to one passed with
// WithBackend.
func WithoutPrestart() Option {
	return func(o *options) error { o.noPrestart = true; return nil }
}

// WithKeepWarm lets the backend the sandbox selects keep what it started
// for a later process on the same workspace, for up to idle unused: on
// Docker the container, which a later sandbox with the same settings
// takes over instead of making one (docker.WithReuse; idle at least a
// minute); on namespace a sandbox init started ahead, held by a keeper
// process that a later process takes it from (namespace.WithKeeper). A CLI process, which runs one command and ends, uses it so
// that the next command does not pay for a new container. Commands still
// see exactly the workspace plus the pending stack; a process that dies
// while it holds a container leaves it to be removed, never reused.
func WithKeepWarm(idle time.Duration) Option {
	return func(o *options) error {
		if idle < time.Minute {
			return fmt.Errorf("sandbox: WithKeepWarm: idle lifetime %s is under a minute", idle)
		}
		o.keepWarm = idle
		return nil
	}
}

// probeCacheFile is where a backend remembers, per machine and user, that
// its Probe succeeded (see namespace.WithProbeCache): under the user's
// cache directory, $XDG_CACHE_HOME or ~/.cache, as os.UserCacheDir has it
// on Linux. "" (no cache) when neither is set to an absolute path, and
// for pulse doctor (Diagnose), which always probes in full.
func (o *options) probeCacheFile(name string) string {
	if o.fullProbe {
		return ""
	}
	dir := o.getenv("XDG_CACHE_HOME")
	if !filepath.IsAbs(dir) {
		home := o.getenv("HOME")
		if !filepath.IsAbs(home) {
			return ""
		}
		dir = filepath.Join(home, ".cache")
	}
	return filepath.Join(dir, "pulse", "probe-"+name)
}

// ahead is the remote candidate made and probed while New does the rest
// of its work: its Probe is network round trips (a TCP connect, an HTTP
// upgrade, the capabilities request) that need nothing New prepares, and
// they would otherwise wait for the audit log, the staging area and
// their recovery. Selection takes it in the remote candidate's turn,
// exactly as if it probed then.
type ahead struct {
	name   string
	b      backend.Backend
	err    error // of make, or of Probe (b is then closed and nil)
	done   chan struct{}
	cancel context.CancelFunc
	taken  bool
}

// probeAhead starts probing the remote candidate when selection will try
// it first (PULSE_REMOTE_URL set, no backend given or another named, no
// image); nil otherwise.
func probeAhead(ctx context.Context, o *options) *ahead {
	if o.backend != nil || o.image != "" || (o.backendName != "" && o.backendName != "auto" && o.backendName != "remote") {
		return nil
	}
	c := candidates()[0]
	if c.skip(o) != "" {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	a := &ahead{name: c.name, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(a.done)
		b, err := c.make(o)
		if err == nil {
			if err = b.Probe(pctx); err != nil {
				_ = b.Close()
				b = nil
			}
		}
		a.b, a.err = b, err
	}()
	return a
}

// pending says whether the probe has not ended yet.
func (a *ahead) pending() bool {
	if a == nil {
		return false
	}
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// take waits for the probe and returns its outcome, once.
func (a *ahead) take() (backend.Backend, error) {
	<-a.done
	a.cancel()
	a.taken = true
	return a.b, a.err
}

// discard ends a probe selection did not take (New failed before it, or
// selected nothing): nil and taken ones are left alone.
func (a *ahead) discard() {
	if a == nil || a.taken {
		return
	}
	a.cancel()
	if b, _ := a.take(); b != nil {
		_ = b.Close()
	}
}

// selectBackend returns the first candidate that is available, with one
// "name: reason" line for each candidate passed over before it, or an
// error wrapping ErrUnavailable that names every candidate and why it was
// not used.
func selectBackend(ctx context.Context, o *options, early *ahead) (backend.Backend, []string, error) {
	var why []string
	found := false
	if err := o.checkImageBackend(); err != nil {
		return nil, nil, err
	}
	for _, c := range candidates() {
		if o.backendName != "" && o.backendName != "auto" && o.backendName != c.name {
			continue
		}
		if o.image != "" && c.name != "docker" {
			continue // an image was asked for: only Docker runs images
		}
		found = true
		if early != nil && c.name == early.name {
			b, err := early.take()
			if err == nil {
				return b, why, nil
			}
			if ctx.Err() != nil {
				return nil, why, ctx.Err()
			}
			why = append(why, reason(c.name, err))
			continue
		}
		if c.skip != nil {
			if reason := c.skip(o); reason != "" {
				why = append(why, c.name+": "+reason)
				continue
			}
		}
		b, err := c.make(o)
		if err != nil {
			why = append(why, reason(c.name, err))
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err = b.Probe(pctx)
		cancel()
		if err == nil {
			return b, why, nil
		}
		_ = b.Close()
		if ctx.Err() != nil {
			return nil, why, ctx.Err()
		}
		why = append(why, reason(c.name, err))
	}
	if !found {
		return nil, why, fmt.Errorf("sandbox: unknown backend %q", o.backendName)
	}
	return nil, why, &UnavailableError{Tried: why}
}

// reason is one "name: why" line; backends already prefix their errors
// with their name, which is not repeated.
func reason(name string, err error) string {
	return name + ": " + strings.TrimPrefix(err.Error(), name+": ")
}

// UnavailableError is returned by New when no backend can run commands.
// It wraps ErrUnavailable.
type UnavailableError struct {
	// Tried holds one "name: reason" line per backend considered.
	Tried []string
}

func (e *UnavailableError) Error() string {
	return "sandbox: no backend available:\n  " + strings.Join(e.Tried, "\n  ")
}

// Unwrap makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Unwrap() error { return ErrUnavailable }
