package backend

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/errdefs"
	"github.com/pulse-agent/pulse/policy"
)

// A Driver offers a backend to automatic selection (sandbox.New without
// WithBackend), the way a database/sql driver offers itself to sql.Open:
// the backend's package registers its Driver from an init function, so a
// program links exactly the backends it imports. The sandbox facade
// imports none; backend/all imports them all (what the pulse binary
// does), and a program that wants only namespaces imports only
// backend/namespace.
type Driver struct {
	// Name is the backend's Name() and the name WithBackendName takes.
	Name string
	// Rank orders selection, lowest first. The product's order is
	// remote (RankRemote), Docker, namespaces, host.
	Rank int
	// Skip says why the driver is not even tried with this configuration
	// ("" = try it); nil tries it always.
	Skip func(*Config) string
	// Open makes the backend, unprobed: selection probes it.
	Open func(*Config) (Backend, error)
	// ProbeEarly: the backend's Probe is network round trips that need
	// nothing the sandbox prepares, so selection may start it while New
	// opens the audit log and the staging area.
	ProbeEarly bool
	// Prewarm, if set, starts in the background what Open would prepare;
	// the facade calls it early when the backend is named.
	Prewarm func()
	// BoxLimits: the backend applies Config.Limits to the whole box when
	// it is opened (memory, cpu, pids of a container), not per command,
	// so a command may not bring limits of its own for them.
	BoxLimits bool
	// RunsImages: the backend runs Config.Image; an image asked for
	// restricts selection to such backends.
	RunsImages bool
	// StrongIsolation: the backend's commands' system calls do not reach
	// the host kernel directly (IsolationGVisor). Selection tries such a
	// backend unnamed only for a policy asking for isolation: strong,
	// and then no other.
	StrongIsolation bool
}

// Ranks of the product's backends: the selection order of DESIGN.md.
const (
	RankRemote    = 10
	RankDocker    = 20
	RankNamespace = 30
	RankHost      = 40
)

// Config is what the facade hands a Driver to open its backend with.
type Config struct {
	Logger    *slog.Logger
	SessionID string
	// Getenv reads the environment (os.Getenv, or a test's).
	Getenv func(string) string
	// Image is the container image asked for ("" = the backend's own).
	Image string
	// Limits are the sandbox's ceiling, defaults filled in.
	Limits *policy.ResourceLimits
	// KeepWarm > 0 lets the backend keep what it started for a later
	// process on the same workspace, for up to that long unused.
	KeepWarm time.Duration
	// NoPrestart: the sandbox runs one command; start nothing ahead for
	// a next one.
	NoPrestart bool
	// UnsafeHost: the program opted in to unisolated host execution.
	UnsafeHost bool
	// ProbeCache is a file where the backend may remember that its
	// Probe succeeded ("" = probe in full every time).
	ProbeCache string
	// Options are the program's options for this backend, of the
	// backend package's own Option type (sandbox.WithRemoteOptions).
	// Open refuses one of another type with ErrOptionType.
	Options []any
}

var (
	driversMu sync.RWMutex
	drivers   []Driver
)

// Register makes d available to selection. It panics, as sql.Register
// does, when d has no name or open function or its name is taken: both
// are mistakes in the program, found at its start.
func Register(d Driver) {
	if d.Name == "" || d.Open == nil {
		panic("backend: Register of a driver without a name or Open")
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	for _, r := range drivers {
		if r.Name == d.Name {
			panic(fmt.Sprintf("backend: Register called twice for %q", d.Name))
		}
	}
	drivers = append(drivers, d)
	slices.SortStableFunc(drivers, func(a, b Driver) int { return a.Rank - b.Rank })
}

// Drivers returns the registered drivers in selection order.
func Drivers() []Driver {
	driversMu.RLock()
	defer driversMu.RUnlock()
	return slices.Clone(drivers)
}

// ErrOptionType: a program passed a backend an option of another type
// than the backend's own Option (Config.Options). It is of class
// ErrInvalidRequest; selection fails on it instead of passing the backend
// over.
var ErrOptionType = errdefs.New("backend option of another type", ErrInvalidRequest)

// OptionsOf returns opts as the option type T of the backend name, or an
// error wrapping ErrOptionType that names the first of another type.
func OptionsOf[T any](name string, opts []any) ([]T, error) {
	out := make([]T, 0, len(opts))
	for i, o := range opts {
		t, ok := o.(T)
		if !ok {
			return nil, fmt.Errorf("%w: %s option %d is a %T, not a %T", ErrOptionType, name, i, o, t)
		}
		out = append(out, t)
	}
	return out, nil
}
