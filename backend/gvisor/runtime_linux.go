//go:build linux

package gvisor

import "github.com/pulse-agent/pulse/backend/internal/rtprog"

// The warm sandbox's init is pulse's in-box runtime (cmd/pulse-runtime,
// its gvserve step), found and checked by the rules the Docker backend's
// injection follows (backend/internal/rtprog): WithRuntime's path; else
// pulse-runtime beside the running binary, trusted as much as that
// binary; else, where the binary was built from a checkout still at hand
// (go run, test binaries), built from it once per process. Whichever it
// is must be static and report this build's runtime identity. Without
// one, commands run cold (a sandbox each).

// runtimeBytes is the runtime program for WithRuntime's choice.
func runtimeBytes(choice string) ([]byte, error) { return rtprog.Bytes(choice) }
