package namespace

import "github.com/pulse-agent/pulse/backend"

// Importing the package offers namespaces to automatic selection
// (backend.Register). A program that may select it must still call Init
// first thing in main.
func init() {
	backend.Register(backend.Driver{
		Name:    "namespace",
		Rank:    backend.RankNamespace,
		Open:    open,
		Prewarm: Prewarm,
	})
}

func open(c *backend.Config) (backend.Backend, error) {
	opts, err := backend.OptionsOf[Option]("namespace", c.Options)
	if err != nil {
		return nil, err
	}
	opts = append([]Option{WithLogger(c.Logger)}, opts...)
	if c.ProbeCache != "" {
		opts = append(opts, WithProbeCache(c.ProbeCache))
	}
	if c.NoPrestart {
		opts = append(opts, WithoutPrestart())
	}
	if c.KeepWarm > 0 {
		opts = append(opts, WithKeeper(c.KeepWarm))
	}
	return New(opts...)
}
