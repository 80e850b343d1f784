// Package wire holds the contracts Pulse speaks between its own processes.
//
// Subpackage sandbox/v1 is the gRPC contract between pulse-server (the
// relay) and pulse-worker: the service SandboxWorker with its single
// bidirectional Attach stream. The .proto file is the source of truth; the
// Go code next to it is generated, committed, and refreshed with
// "go generate ./internal/wire/...". Field numbers never change once
// published.
package wire
