//go:build !linux

package gvisor

import (
	"context"
	"fmt"

	"github.com/pulse-agent/pulse/backend"
)

// Backend is unavailable off Linux: runsc runs on Linux only.
type Backend struct{ o options }

var _ backend.Backend = (*Backend)(nil)

// New makes a Backend whose Probe says it is unavailable.
func New(opts ...Option) (*Backend, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	defaults(&o)
	return &Backend{o: o}, nil
}

func (b *Backend) Name() string { return Name }
func (b *Backend) Capabilities() backend.Capabilities {
	return capabilities("", false, false, "not Linux")
}
func (b *Backend) Platform() string                { return "" }
func (b *Backend) Reconcile(context.Context) error { return nil }
func (b *Backend) Close() error                    { return nil }
func (b *Backend) Probe(context.Context) error {
	return fmt.Errorf("gvisor: %w: runsc runs on Linux only", backend.ErrUnavailable)
}
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	return nil, b.Probe(ctx)
}
