package namespace

import (
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, WithStateDir(filepath.Join(t.TempDir(), "state")))
	})
}
