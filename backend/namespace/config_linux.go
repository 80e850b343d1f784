package namespace

import (
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
)

// childConfig is the init's config (nsinit.Config, what travels on the
// config pipe: the embedded struct's fields are the JSON object's) with
// what the backend keeps beside it while it prepares the run.
type childConfig struct {
	nsinit.Config

	// envMap is Env before HOME is known.
	envMap map[string]string
	// hidden are the request's hidden paths (checkHidden): whiteouts in the
	// upper layer before the overlay is mounted.
	hidden hiddenSet
	// pend is the view the Layers (pending_linux.go) make, for reading
	// the overlay back.
	pend *backend.Pending
}
