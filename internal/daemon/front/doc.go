// Command front is what `make build` installs as pulse: a thin front end
// to the full pulse program (cmd/pulse), installed beside it as
// pulse-full.
//
// Why it exists: a command handed to the daemon costs the client little
// more than its own start, and the full binary's start (a Go program
// that links the Docker client, the MCP SDK, YAML...: 22 MB, ~350
// packages, whose initialisers all run before main) is 5-9 ms on this
// project's 2-core machine class, a Go program that links only this
// package's client side 2-3 ms: the difference between 1.5x and 1x a
// bwrap `true`. bench/cli.sh measures both (the BenchmarkCLIDaemon rows
// run this front end, the BenchmarkCLIFullDaemon rows the full binary).
//
// On Linux it hands the commands of client.Commands (exec, cow, mcp,
// review) to the daemon of the full binary, and executes the full binary for everything else, or
// where no daemon serves (main_linux.go); elsewhere it always executes
// the full binary. `go run ./cmd/pulse` and `go install ./cmd/pulse` give
// the full binary alone, which works the same, its start the slower.
package main
