package gvisor

import (
	"io"
	"log/slog"
)

// Option configures a Backend.
type Option func(*options)

type options struct {
	log      *slog.Logger
	runsc    string
	platform string
	stateDir string
	runtime  string
	cold     bool
}

// WithRuntime sets the in-box runtime program (cmd/pulse-runtime, built
// from the same source) that is the warm sandbox's init; by default it is
// looked for beside the running binary.
func WithRuntime(path string) Option { return func(o *options) { o.runtime = path } }

// WithCold runs every command in a sandbox of its own, started for it
// (the fallback where no warm sandbox can start), instead of in the
// Backend's warm sandbox.
func WithCold() Option { return func(o *options) { o.cold = true } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithRunsc sets the runsc binary (default: $PULSE_RUNSC, else runsc on
// PATH).
func WithRunsc(path string) Option { return func(o *options) { o.runsc = path } }

// WithPlatform sets runsc's platform ("systrap", "ptrace", "kvm";
// default: systrap where the runsc has it, ptrace otherwise).
func WithPlatform(p string) Option { return func(o *options) { o.platform = p } }

// WithStateDir sets the directory holding each execution's mounts and
// runsc's own state (default: /run/pulse-gvisor).
func WithStateDir(dir string) Option { return func(o *options) { o.stateDir = dir } }

func defaults(o *options) {
	if o.log == nil {
		o.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.stateDir == "" {
		o.stateDir = "/run/pulse-gvisor"
	}
}
