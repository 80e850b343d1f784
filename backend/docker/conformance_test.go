package docker

import (
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
)

func TestDockerConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return newDocker(t) },
		// The engine sets HOSTNAME in every container.
		backendtest.AllowEnv("HOSTNAME"),
		// A command costs an exec round trip or two; kills go through a
		// second exec.
		backendtest.WithTimeScale(2),
		backendtest.WithOverlayLoss("the overlay limit is lowered below the size of the file the command writes, "+
			"so the wrapper's report of the changes is refused", func(t *testing.T) backend.Backend {
			old := maxOverlayBytes
			maxOverlayBytes = backendtest.LostFileBytes / 2
			t.Cleanup(func() { maxOverlayBytes = old })
			return newDocker(t)
		}),
	)
}
