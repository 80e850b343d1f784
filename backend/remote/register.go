package remote

import (
	"strings"

	"github.com/pulse-agent/pulse/backend"
)

// Importing the package offers the remote backend to automatic selection
// (backend.Register): first, when PULSE_REMOTE_URL is set.
func init() {
	backend.Register(backend.Driver{
		Name: "remote",
		Rank: backend.RankRemote,
		Skip: func(c *backend.Config) string {
			if strings.TrimSpace(c.Getenv("PULSE_REMOTE_URL")) == "" {
				return "PULSE_REMOTE_URL is not set"
			}
			return ""
		},
		Open:       open,
		ProbeEarly: true,
	})
}

func open(c *backend.Config) (backend.Backend, error) {
	opts, err := backend.OptionsOf[Option]("remote", c.Options)
	if err != nil {
		return nil, err
	}
	return FromEnv(c.Getenv, append([]Option{WithLogger(c.Logger)}, opts...)...)
}
