// Package sandboxv1 is the generated Go code of the gRPC contract
// sandbox.v1 (worker.proto): the SandboxWorker service that pulse-worker
// dials and pulse-server serves. Do not edit the .pb.go files; change
// worker.proto and run "go generate ./internal/wire/...".
package sandboxv1
