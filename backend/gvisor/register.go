package gvisor

import "github.com/pulse-agent/pulse/backend"

// RankGVisor places gVisor last in selection order. Selection tries it
// unnamed only for a policy asking for `isolation: strong`, and then
// tries only backends of that isolation (Driver.StrongIsolation).
const RankGVisor = backend.RankHost + 10

// Importing the package offers gVisor to selection (backend.Register).
func init() {
	backend.Register(backend.Driver{
		Name:            Name,
		Rank:            RankGVisor,
		Open:            open,
		StrongIsolation: true,
	})
}

func open(c *backend.Config) (backend.Backend, error) {
	opts, err := backend.OptionsOf[Option](Name, c.Options)
	if err != nil {
		return nil, err
	}
	opts = append([]Option{WithLogger(c.Logger)}, opts...)
	if c.Getenv != nil {
		if p := c.Getenv("PULSE_RUNSC"); p != "" {
			opts = append([]Option{WithRunsc(p)}, opts...)
		}
	}
	return New(opts...)
}
