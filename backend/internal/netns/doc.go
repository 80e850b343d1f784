// Package netns runs one call inside the network namespace of another
// process: the one place that holds the rule for entering a namespace on
// a locked OS thread and coming back (a thread that cannot come back is
// never unlocked, so the runtime ends it and nothing else runs there by
// mistake). Used by the Docker backend (the egress bridge listens in a
// container).
package netns
