package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// probeTimeout bounds each backend's Probe during selection, so that an
// engine that does not answer cannot stall New.
const probeTimeout = 10 * time.Second

// candidates are the registered drivers (backend.Register) in selection
// order: the product's is remote, Docker, namespaces, host (opt-in). A
// backend whose package the program does not import is not among them.
func candidates() []backend.Driver { return backend.Drivers() }

// config is what the sandbox hands driver d to open its backend with.
func (o *options) config(d backend.Driver) *backend.Config {
	c := &backend.Config{
		Logger:     o.logger,
		SessionID:  o.sessionID,
		Getenv:     o.getenv,
		Limits:     o.limits,
		KeepWarm:   o.keepWarm,
		NoPrestart: o.noPrestart,
		UnsafeHost: o.unsafeHost,
		ProbeCache: o.probeCacheFile(d.Name),
		Options:    o.backendOpts[d.Name],
	}
	if d.RunsImages {
		c.Image = o.dockerImage()
	}
	return c
}

// skip says why d is not even tried ("" = try it).
func (o *options) skip(d backend.Driver) string {
	if d.Skip == nil {
		return ""
	}
	return d.Skip(o.config(d))
}

// open makes d's backend, unprobed.
func (o *options) open(d backend.Driver) (backend.Backend, error) {
	return d.Open(o.config(d))
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
	name string
	b    backend.Backend
	err  error // of Open, or of Probe (b is then closed and nil)
	// badOpts: Open refused the program's options for the backend.
	badOpts bool
	done    chan struct{}
	cancel  context.CancelFunc
	taken   bool
}

// probeAhead starts probing the first candidate selection will try when
// its driver allows it (backend.Driver.ProbeEarly: remote, with
// PULSE_REMOTE_URL set); nil otherwise.
func probeAhead(ctx context.Context, o *options) *ahead {
	if o.backend != nil {
		return nil
	}
	var c backend.Driver
	for _, d := range candidates() {
		if o.tries(d) {
			c = d
			break
		}
	}
	if !c.ProbeEarly || o.skip(c) != "" {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	a := &ahead{name: c.Name, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(a.done)
		b, err := o.open(c)
		a.badOpts = errors.Is(err, backend.ErrOptionType)
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

// tries says whether selection considers d at all: it is the backend
// named, if one is, and runs images, if one was asked for. Unnamed, a
// backend of strong isolation (gVisor) is tried only for a policy that
// asks for isolation: strong, and then only such backends are: never
// picked silently over namespace, never downgraded from.
func (o *options) tries(d backend.Driver) bool {
	named := o.backendName != "" && o.backendName != "auto"
	if named && o.backendName != d.Name {
		return false
	}
	if !named && d.StrongIsolation != o.strongIsolation() {
		return false
	}
	return o.image == "" || d.RunsImages // only Docker runs images
}

// strongIsolation says whether the policy asks for isolation: strong.
func (o *options) strongIsolation() bool {
	return o.policy != nil && o.policy.Isolation == policy.IsolationStrong
}

// checkIsolation refuses a backend that does not meet the policy's
// isolation: strong (ErrIsolationDowngrade).
func (o *options) checkIsolation(name string, caps backend.Capabilities) error {
	if o.strongIsolation() && caps.Isolation != backend.IsolationGVisor {
		return fmt.Errorf("%w: backend %q isolates at level %q", ErrIsolationDowngrade, name, caps.Isolation)
	}
	return nil
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
		if !o.tries(c) {
			continue
		}
		found = true
		if early != nil && c.Name == early.name {
			b, err := early.take()
			if err == nil {
				return b, why, nil
			}
			if early.badOpts {
				return nil, why, fmt.Errorf("sandbox: %w", err)
			}
			if ctx.Err() != nil {
				return nil, why, ctx.Err()
			}
			why = append(why, reason(c.Name, err))
			continue
		}
		if r := o.skip(c); r != "" {
			why = append(why, c.Name+": "+r)
			continue
		}
		b, err := o.open(c)
		if errors.Is(err, backend.ErrOptionType) {
			// The program's options for it are wrong: a mistake to
			// report, not a backend to pass over.
			return nil, why, fmt.Errorf("sandbox: %w", err)
		}
		if err != nil {
			why = append(why, reason(c.Name, err))
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
		why = append(why, reason(c.Name, err))
	}
	if !found {
		if o.backendName != "" && o.backendName != "auto" {
			return nil, why, fmt.Errorf("sandbox: unknown backend %q: the program does not import its package "+
				"(github.com/pulse-agent/pulse/backend/%s, or backend/all for every backend)", o.backendName, o.backendName)
		}
		return nil, why, &UnavailableError{Tried: []string{"no backend is linked into this program: import github.com/pulse-agent/pulse/backend/all, or the backends wanted"}}
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
