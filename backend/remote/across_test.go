package remote

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/gvisor"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// One workspace, stack and cache, commands on namespace, a pulse-server,
// Docker and gVisor in turn (backendtest.RunAcross): a session and a
// cache move between every kind of box. The cross-backend cases live here, not in
// backend/all, because the server the remote backend talks to is this
// package's test server. Docker is left out, not skipped, where no engine
// answers and PULSE_REQUIRE_DOCKER is unset, and gVisor where runsc
// cannot start a sandbox and PULSE_REQUIRE_GVISOR is unset: namespace and
// remote still make a pair.
func TestAcrossBackends(t *testing.T) {
	ts := startServer(t)
	backends := []backendtest.Named{
		{Name: "namespace", Factory: func(t *testing.T) backend.Backend {
			b, err := namespace.New(namespace.WithStateDir(filepath.Join(t.TempDir(), "state")))
			if err != nil {
				t.Fatal(err)
			}
			testenv.MustHaveNamespace(t, b.Probe)
			return b
		}},
		{Name: "remote", Factory: func(t *testing.T) backend.Backend { return newBackend(t, ts.url) }},
	}
	if dockerAnswers(t) {
		backends = append(backends, backendtest.Named{Name: "docker", Factory: func(t *testing.T) backend.Backend {
			b, err := docker.New()
			if err != nil {
				t.Fatal(err)
			}
			testenv.MustHaveDocker(t, b.Probe)
			return b
		}})
	}
	if gvisorAnswers(t) {
		backends = append(backends, backendtest.Named{Name: "gvisor", Factory: func(t *testing.T) backend.Backend {
			b, err := gvisor.New(gvisor.WithStateDir(filepath.Join(t.TempDir(), "gvisor")))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			testenv.MustHave(t, testenv.GVisor, b.Probe(ctx))
			return b
		}})
	}
	backendtest.RunAcross(t, backends, backendtest.WithTimeScale(2))
}

// gvisorAnswers is whether the gVisor cases can run here (runsc, as
// root); true where gVisor is required, as for Docker.
func gvisorAnswers(t *testing.T) bool {
	if testenv.Required(testenv.GVisor) {
		return true
	}
	g, err := gvisor.New(gvisor.WithStateDir(filepath.Join(t.TempDir(), "gvisor-probe")))
	if err != nil {
		return false
	}
	defer g.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	return g.Probe(ctx) == nil
}

// dockerAnswers is whether the Docker cases can run here; where Docker is
// required (CI) it is true, so that a missing engine fails in the factory
// instead of leaving the case out.
func dockerAnswers(t *testing.T) bool {
	if testenv.Required(testenv.Docker) {
		return true
	}
	d, err := docker.New()
	if err != nil {
		return false
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(t.Context(), testenv.ProbeTimeout)
	defer cancel()
	return d.Probe(ctx) == nil
}
