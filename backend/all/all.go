// Package all offers every backend of the product to automatic selection
// (sandbox.New without WithBackend): remote, Docker, namespaces, the
// opt-in host, and gVisor (tried when named or for isolation: strong). A program imports it for its side effect, as the pulse
// binary does:
//
//	import _ "github.com/pulse-agent/pulse/backend/all"
//
// A program that wants fewer imports only those backends' packages; one
// that imports only backend/namespace links no Docker client.
package all

import (
	_ "github.com/pulse-agent/pulse/backend/docker"
	_ "github.com/pulse-agent/pulse/backend/gvisor"
	_ "github.com/pulse-agent/pulse/backend/host"
	_ "github.com/pulse-agent/pulse/backend/namespace"
	_ "github.com/pulse-agent/pulse/backend/remote"
)
