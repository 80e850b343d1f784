package host

import "github.com/pulse-agent/pulse/backend"

// Importing the package offers unsafe host execution to automatic
// selection (backend.Register): last, and only to a program that opted in
// (sandbox.WithUnsafeHostExecution).
func init() {
	backend.Register(backend.Driver{
		Name: "host",
		Rank: backend.RankHost,
		Skip: func(c *backend.Config) string {
			if !c.UnsafeHost {
				return "not allowed: commands would run unisolated on this machine " +
					"(opt in with WithUnsafeHostExecution, or `pulse exec --unsafe-host`)"
			}
			return ""
		},
		Open: open,
	})
}

func open(c *backend.Config) (backend.Backend, error) {
	opts, err := backend.OptionsOf[Option]("host", c.Options)
	if err != nil {
		return nil, err
	}
	return New(append([]Option{WithLogger(c.Logger)}, opts...)...)
}
