// Package backend is the contract between the sandbox facade and the
// mechanisms that run commands: the host (unsafe, opt-in), Linux namespaces,
// a Docker Engine, or a remote pulse-server.
//
// A Backend runs a Request and returns a Result. Isolating backends show the
// command a read-only workspace and return what it wrote as an Overlay; the
// facade stages that overlay into a copy-on-write transaction, so nothing
// reaches the real workspace until it is committed.
//
// Every implementation passes the conformance suite in backend/backendtest.
package backend
