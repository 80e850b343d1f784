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
	)
}
