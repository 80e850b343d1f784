package namespace

// WaitWarm lets the benchmarks of package namespace_test (which drive the
// backend through the sandbox facade) wait, inside their timed region,
// for the inits an Exec started ahead.
func WaitWarm(b *Backend) { b.waitWarm() }

// DropWarm ends every init started ahead and not yet taken (after waiting
// for any being started), so that a benchmark's first timed Exec starts
// its own instead of using one started in an untimed wait (a Probe's).
func DropWarm(b *Backend) {
	b.waitWarm()
	b.mu.Lock()
	var ps []*initProc
	for net, warm := range b.warm {
		ps = append(ps, warm...)
		b.warm[net] = nil
	}
	b.mu.Unlock()
	for _, p := range ps {
		p.discard()
	}
}
