package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Capability is something a test needs from the machine. Its upper-case
// form names the variable that makes it required: PULSE_REQUIRE_DOCKER for
// Docker.
type Capability string

const (
	// Docker: an answering Docker Engine with the sandbox image built
	// (scripts/testenv.sh prepares both).
	Docker Capability = "docker"
	// Root: the test runs as uid 0.
	Root Capability = "root"
	// Namespace: the namespace backend works here (user namespaces,
	// overlayfs, ...).
	Namespace Capability = "namespace"
	// Bwrap: bubblewrap, the reference the namespace benchmarks compare
	// against.
	Bwrap Capability = "bwrap"
	// Busybox: a static busybox on the host (Debian: busybox-static).
	Busybox Capability = "busybox"
	// Chromium: Debian's chromium with playwright-core installed for the
	// review page's browser test.
	Chromium Capability = "chromium"
	// Node: node, with the npm packages the tests drive installed.
	Node Capability = "node"
	// Postgres: PostgreSQL's server programs (initdb, pg_ctl, createdb;
	// Debian: postgresql, which scripts/testenv.sh installs), run by
	// StartPostgres.
	Postgres Capability = "postgres"
	// GVisor: runsc starts sandboxes here, as root (Debian: runsc,
	// which scripts/testenv.sh installs).
	GVisor Capability = "gvisor"
)

// EnvPrefix starts the variable that makes a capability required.
const EnvPrefix = "PULSE_REQUIRE_"

// Env is the variable that makes c required: PULSE_REQUIRE_DOCKER.
func (c Capability) Env() string {
	return EnvPrefix + strings.ToUpper(string(c))
}

// Required reports whether the environment requires c: its variable is
// set to anything but "" or "0". Anything else counts, so that a
// misspelt value fails closed (a failure) rather than open (a skip).
func Required(c Capability) bool {
	v := os.Getenv(c.Env())
	return v != "" && v != "0"
}

// Missing ends the test because c is missing: a failure when c is
// Required, a skip otherwise. why says what is missing and, where it
// helps, how to get it.
func Missing(t testing.TB, c Capability, why string) {
	t.Helper()
	if Required(c) {
		t.Fatalf("%s=%s but %s", c.Env(), os.Getenv(c.Env()), why)
	}
	t.Skipf("needs %s: %s", c, why)
}

// MustHave ends the test as Missing does when err, the answer of a probe
// for c, is not nil.
func MustHave(t testing.TB, c Capability, err error) {
	t.Helper()
	if err != nil {
		Missing(t, c, err.Error())
	}
}

// ProbeTimeout bounds the probe MustHaveDocker and MustHaveNamespace run.
const ProbeTimeout = 15 * time.Second

// MustHaveDocker runs probe (a Docker backend's Probe) with ProbeTimeout
// and ends the test as Missing does when it fails. Callers close what
// they probed with t.Cleanup, which runs on a skip as well.
func MustHaveDocker(t testing.TB, probe func(context.Context) error) {
	t.Helper()
	mustProbe(t, Docker, "a Docker engine and the sandbox image (run scripts/testenv.sh as root)", probe)
}

// MustHaveNamespace runs probe (a namespace backend's Probe) with
// ProbeTimeout and ends the test as Missing does when it fails.
func MustHaveNamespace(t testing.TB, probe func(context.Context) error) {
	t.Helper()
	mustProbe(t, Namespace, "user namespaces and overlayfs for the namespace backend", probe)
}

func mustProbe(t testing.TB, c Capability, what string, probe func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	if err := probe(ctx); err != nil {
		Missing(t, c, fmt.Sprintf("%s unavailable: %v", what, err))
	}
}

// MustHaveRoot ends the test as Missing does unless it runs as root. why
// says what needs root.
func MustHaveRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, Root, "not running as root: "+why)
	}
}

// MustHaveCommand returns the path of the program name, or ends the test
// as Missing does for c when it is not in PATH (a name with a slash is
// checked as a path). hint says how to install it.
func MustHaveCommand(t testing.TB, c Capability, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		why := fmt.Sprintf("%s is not installed: %v", name, err)
		if hint != "" {
			why += " (" + hint + ")"
		}
		Missing(t, c, why)
	}
	return p
}
