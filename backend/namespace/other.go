//go:build !linux

package namespace

import (
	"context"
	"fmt"
	"runtime"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// Init does nothing outside Linux; it exists so that mains can call it
// unconditionally.
func Init() {}

// Prewarm does nothing here: there is no namespace backend to prepare for.
func Prewarm() {}

// Backend is unavailable outside Linux.
type Backend struct{ o options }

var _ backend.Backend = (*Backend)(nil)

// New returns a backend that reports itself unavailable.
func New(opts ...Option) (*Backend, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Backend{o: o}, nil
}

func errUnavailable() error {
	return fmt.Errorf("%w: namespace: Linux namespaces do not exist on %s", backend.ErrUnavailable, runtime.GOOS)
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Probe implements backend.Backend.
func (b *Backend) Probe(context.Context) error { return errUnavailable() }

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Isolation:      backend.IsolationNamespace,
		CapturesWrites: true,
		Notes:          []string{"unavailable: Linux only"},
	}
}

// Exec implements backend.Backend.
func (b *Backend) Exec(context.Context, *backend.Request) (*backend.Result, error) {
	return nil, errUnavailable()
}

// Reconcile implements backend.Backend.
func (b *Backend) Reconcile(context.Context) error { return nil }

// Close implements backend.Backend.
func (b *Backend) Close() error { return nil }

// StartAhead does nothing: there is nothing to start here.
func (b *Backend) StartAhead(policy.NetworkPolicy, policy.ResourceLimits) {}
