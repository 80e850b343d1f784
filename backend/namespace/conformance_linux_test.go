package namespace

import (
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
)

func TestConformance(t *testing.T) {
	factory := func(t *testing.T) backend.Backend {
		return newBackend(t, WithStateDir(filepath.Join(t.TempDir(), "state")))
	}
	backendtest.Run(t, factory,
		backendtest.WithOverlayLoss("the overlay limit is lowered below the size of the file the command writes, "+
			"so reading back the upper layer fails with ErrOverlayTooLarge", func(t *testing.T) backend.Backend {
			old := maxOverlayTotal
			maxOverlayTotal = backendtest.LostFileBytes / 2
			t.Cleanup(func() { maxOverlayTotal = old })
			return factory(t)
		}))
}
