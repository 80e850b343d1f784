package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/caches"
	"github.com/pulse-agent/pulse/policy"
)

// WithCache mounts the named persistent cache c read-write into every
// command, on top of the policy file's caches: (a name both declare is an
// error). Its directory lives under caches.Root, is shared by every
// sandbox of the user, and is never reviewed: each command that mounts a
// cache is audited naming it. A backend that cannot mount caches (host,
// remote) refuses the command with ErrUnsupportedPolicy.
func WithCache(c policy.Cache) Option {
	return func(o *options) error {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("sandbox: WithCache: %w", err)
		}
		o.caches = append(o.caches, c)
		return nil
	}
}

// cacheList is every cache a command mounts: the policy's, then the
// options'.
func (o *options) cacheList() ([]policy.Cache, error) {
	var all []policy.Cache
	if o.policy != nil {
		all = append(all, o.policy.Caches...)
	}
	all = append(all, o.caches...)
	if err := policy.ValidateCaches(all); err != nil {
		return nil, fmt.Errorf("sandbox: caches: %w", err)
	}
	return all, nil
}

// prepareCaches refuses caches on a backend that cannot mount them,
// creates the host directories, points each cache's variable at its path
// in env, and audits the one place this command writes unreviewed.
func (s *Sandbox) prepareCaches(ctx context.Context, execID, cmdStr string, env map[string]string) ([]backend.Cache, error) {
	if len(s.caches) == 0 {
		return nil, nil
	}
	names := make([]string, len(s.caches))
	for i, c := range s.caches {
		names[i] = c.Name
	}
	target := strings.Join(names, ",")
	if !s.caps.MountsCaches {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "cache", Target: target, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(), Reason: "unsupported_policy",
			Detail: "backend cannot mount caches; command " + cmdStr})
		return nil, fmt.Errorf("%w: backend %q cannot mount the caches %s (remove them from the policy or pick another backend)",
			ErrUnsupportedPolicy, s.backend.Name(), target)
	}
	root, err := caches.Root(s.o.getenv)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	out := make([]backend.Cache, 0, len(s.caches))
	var where []string
	for _, c := range s.caches {
		dir, err := caches.Ensure(root, c.Name)
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		p := c.MountPath()
		if policy.PathWithin(p, s.workspace) || policy.PathWithin(s.workspace, p) {
			return nil, fmt.Errorf("%w: cache %s at %s overlaps the workspace %s", ErrInvalidCommand, c.Name, p, s.workspace)
		}
		out = append(out, backend.Cache{Name: c.Name, HostDir: dir, Path: p, Env: c.Env})
		if c.Env != "" {
			env[c.Env] = p
		}
		where = append(where, c.Name+" at "+p+" ("+dir+")")
	}
	if err := s.record(ctx, audit.Event{ExecutionID: execID, Action: "cache", Target: target, Decision: "allow",
		IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(), Reason: "not_reviewed",
		Detail: "mounted read-write, writes not reviewed: " + strings.Join(where, ", ")}); err != nil {
		return nil, err
	}
	return out, nil
}

// trimCaches holds each capped cache to its max_bytes after a command,
// oldest files first, and audits what it removed. The command that went
// over has finished; the next one starts under the cap.
func (s *Sandbox) trimCaches(ctx context.Context, execID string, mounted []backend.Cache) {
	for i, bc := range mounted {
		c := s.caches[i]
		if c.MaxBytes <= 0 {
			continue
		}
		before, removed, err := caches.Trim(bc.HostDir, c.MaxBytes)
		switch {
		case err != nil:
			s.log.Warn("cache trim failed", "cache", c.Name, "err", err)
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "cache", Target: c.Name, Decision: "deny",
				Reason: "trim_failed", Detail: err.Error()})
		case removed > 0:
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "cache", Target: c.Name, Decision: "allow",
				Reason: "trimmed", Detail: fmt.Sprintf("%d bytes over the cap of %d: removed the %d oldest files", before-c.MaxBytes, c.MaxBytes, removed)})
		}
	}
}
