package all_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// One workspace, stack and cache, commands on namespace and Docker in
// turn (backendtest.RunAcross).
func TestAcrossNamespaceAndDocker(t *testing.T) {
	backendtest.RunAcross(t, []backendtest.Named{
		{Name: "namespace", Factory: func(t *testing.T) backend.Backend {
			b, err := namespace.New(namespace.WithStateDir(filepath.Join(t.TempDir(), "state")))
			if err != nil {
				t.Fatal(err)
			}
			testenv.MustHaveNamespace(t, b.Probe)
			return b
		}},
		{Name: "docker", Factory: func(t *testing.T) backend.Backend {
			b, err := docker.New()
			if err != nil {
				t.Fatal(err)
			}
			testenv.MustHaveDocker(t, b.Probe)
			return b
		}},
	}, backendtest.WithTimeScale(2))
}

func TestMain(m *testing.M) {
	namespace.Init()
	os.Exit(m.Run())
}
