// Package testenv is the one home of the test suite's tooling: what a test
// needs from the machine and how a missing piece is reported, a throwaway
// PKI, a poll-until helper, and the re-execution of the test binary as a
// child program. It is imported only by _test.go files and by test-only
// packages; it imports nothing of the project, so every package, however
// low, can use it.
//
// # Capabilities and PULSE_REQUIRE_*
//
// A test that needs something the machine may lack (a Docker engine and
// the sandbox image, root, user namespaces, a tool such as bwrap, busybox,
// chromium or node) asks with MustHaveDocker, MustHaveRoot,
// MustHaveNamespace, MustHaveCommand or MustHave. When it is missing the
// test skips and names what is missing and how to get it — unless the
// environment requires that capability, where the same call fails the
// test. There is one rule, for every capability:
//
//	PULSE_REQUIRE_<CAPABILITY> set to anything but "" or "0"
//
// (PULSE_REQUIRE_DOCKER=1, PULSE_REQUIRE_ROOT=1, PULSE_REQUIRE_NODE=1, ...;
// the names are the Capability constants in upper case). CI (.ci/run) sets
// the ones scripts/testenv.sh provides, so there a missing engine is a
// failure, never a silent skip.
//
// # Helpers
//
//   - GoMirror: a GOPROXY directory of one module and its go.sum lines.
//   - Generated: a section of a Markdown page that must be what a program
//     prints (its help); PULSE_UPDATE_DOCS=1 (make docs) rewrites it.
//   - StartPostgres: a throwaway PostgreSQL cluster (initdb and pg_ctl
//     from /usr/lib/postgresql/*/bin, on a private Unix socket, stopped
//     and removed when the test ends; SharedPostgres keeps one for the
//     whole test binary) and NewDatabase for an empty database in it;
//     PULSE_REQUIRE_POSTGRES=1 turns a missing server into a failure.
//   - NewPKI: a CA, a server certificate for 127.0.0.1, ::1 and localhost,
//     and a client certificate, as tls.Certificates, a pool and PEM files
//     in t.TempDir().
//   - Eventually: poll a condition until it holds or a deadline passes,
//     failing with the condition's last error; for state another process
//     or goroutine reaches in its own time, never to assert a duration.
//   - Recv: receive from a channel or fail after a generous bound, so a
//     lost wake-up fails the test with what it awaited instead of hanging
//     the package until the test binary's timeout.
//   - RunIfChild and Command: a TestMain dispatches on an environment
//     variable to the real main function of a command, so tests run the
//     worker or the server as a separate process of the test binary
//     itself instead of building one with `go build` (which is slow, needs
//     the toolchain at test time and leaves binaries in temp folders).
//     Where the main function is in a package main the test cannot
//     import, internal/testenv/testproc holds the same program made from
//     the same library (testproc.Worker for pulse-worker).
package testenv
