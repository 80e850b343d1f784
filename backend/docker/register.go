package docker

import "github.com/pulse-agent/pulse/backend"

// Importing the package offers Docker to automatic selection
// (backend.Register): in DESIGN order after remote, before namespaces.
func init() {
	backend.Register(backend.Driver{
		Name:       "docker",
		Rank:       backend.RankDocker,
		Open:       open,
		BoxLimits:  true,
		RunsImages: true,
	})
}

func open(c *backend.Config) (backend.Backend, error) {
	opts, err := backend.OptionsOf[Option]("docker", c.Options)
	if err != nil {
		return nil, err
	}
	// Docker sets memory, cpu and pids limits on the container, not per
	// command: the sandbox's limits become the container's, so that they
	// are enforced, not dropped (Driver.BoxLimits).
	opts = append([]Option{WithLogger(c.Logger), WithSessionID(c.SessionID)}, opts...)
	if c.Image != "" {
		opts = append(opts, WithImage(c.Image))
	}
	if c.Limits != nil {
		opts = append(opts, WithContainerLimits(*c.Limits))
	}
	if c.KeepWarm > 0 {
		opts = append(opts, WithReuse(c.KeepWarm))
	}
	return New(opts...)
}
