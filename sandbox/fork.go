package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
)

// shared is what a sandbox and its forks hold together: the backend and
// the audit log are closed (when the sandbox opened them) by whichever of
// them is closed last.
type shared struct {
	mu   sync.Mutex
	refs int
}

func (h *shared) hold() {
	h.mu.Lock()
	h.refs++
	h.mu.Unlock()
}

// drop reports whether the caller was the last holder.
func (h *shared) drop() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refs--
	return h.refs <= 0
}

// Fork returns a sandbox on the same workspace, with the same options and
// backend, whose pending stack starts as a copy of this one's: its
// commands see every transaction this sandbox's stack holds now. Nothing
// is copied — neither the workspace nor the staged files; the fork is a
// lane of the workspace's transaction store (see cowfs, "Lanes"). From
// then on the two diverge: each command of either sees the workspace,
// the shared transactions and its own sandbox's later ones, never the
// other's. Commands of this sandbox still running when Fork is called
// are not part of the fork.
//
// Committing or discarding follows cowfs's lane rules: CommitAll commits
// the fork's whole stack (the shared transactions too); DiscardAll drops
// only the fork's own; a shared transaction that the other side made a
// change on top of cannot be committed or discarded alone
// (ErrStackDependency). When this sandbox commits a shared transaction,
// the fork's view is unchanged (the workspace holds it now).
//
// A fork is a Sandbox like any other: Close it when done. The backend and
// audit log are released when the last of a sandbox and its forks is
// closed; its pending transactions stay on disk for review (`pulse cow
// list` shows their lane; `--lane` shows a fork's stack).
func (s *Sandbox) Fork(ctx context.Context) (*Sandbox, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	if !s.caps.CapturesWrites {
		return nil, fmt.Errorf("%w: backend %q writes in place; a fork needs a backend that stages writes", ErrUnsupportedPolicy, s.backend.Name())
	}
	lane, err := s.cow.Fork(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox: fork: %w", err)
	}
	opts := append([]cowfs.Option{cowfs.WithLogger(s.o.logger), cowfs.WithoutNewWriteBits(s.o.writeGuard())}, s.o.cowOpts...)
	cow, err := cowfs.Open(ctx, s.workspace, append(opts, cowfs.WithLane(lane))...)
	if err != nil {
		return nil, fmt.Errorf("sandbox: fork: %w", err)
	}
	f := &Sandbox{o: s.o, workspace: s.workspace, guard: s.guard, scrubber: s.scrubber, audit: s.audit,
		ownsAudit: s.ownsAudit, backend: s.backend, ownsBE: s.ownsBE, caps: s.caps, ruledActions: s.ruledActions,
		rulesOnly: s.rulesOnly, readScope: s.readScope, readAhead: s.readAhead, wholeLimits: s.wholeLimits, passedOver: s.passedOver,
		inject: s.inject, caches: s.caches, ca: s.ca, cow: cow, log: s.log, shared: s.shared}
	s.shared.hold()
	s.record(ctx, audit.Event{Action: "fork", Target: lane, Decision: "allow", Backend: s.backend.Name(),
		Detail: fmt.Sprintf("forked lane %s from lane %s", lane, laneName(s.cow.Lane()))})
	return f, nil
}

// Lane is the sandbox's lane of the workspace's transaction store: ""
// for a sandbox made by New (the lane the CLI works on), a fork's id
// otherwise.
func (s *Sandbox) Lane() string { return s.lane() }

// lane is Lane; "" also for a sandbox without a transaction store (a
// backend that writes in place).
func (s *Sandbox) lane() string {
	if s.cow == nil {
		return cowfs.DefaultLane
	}
	return s.cow.Lane()
}

func laneName(id string) string {
	if id == cowfs.DefaultLane {
		return "default"
	}
	return id
}

// releaseShared closes the backend and the audit log when the sandbox
// opened them and no fork of it (or sandbox it was forked from) still
// holds them.
func (s *Sandbox) releaseShared() error {
	if s.shared != nil && !s.shared.drop() {
		return nil
	}
	var errs []error
	var synced chan struct{}
	if s.ownsBE && s.backend != nil && s.ownsAudit && s.audit != nil {
		// The audit log's fsync need not wait for the backend's teardown
		// (a namespace init's reap, its cgroups' and run directory's
		// removal): it runs beside it. Close still comes last and syncs
		// whatever was recorded after it, or what it failed to sync, and
		// reports that error.
		synced = make(chan struct{})
		go func() {
			defer close(synced)
			_ = s.audit.SyncPending()
		}()
	}
	if s.ownsBE && s.backend != nil {
		err := s.backend.Close()
		if synced != nil {
			<-synced
			synced = nil
		}
		s.auditBackendLeftovers(err) // cleanup.go
		errs = append(errs, err)
	}
	if synced != nil {
		<-synced
	}
	if s.ownsAudit && s.audit != nil {
		errs = append(errs, s.audit.Close())
	}
	return errors.Join(errs...)
}
