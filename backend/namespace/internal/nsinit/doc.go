// Package nsinit is the namespace backend's sandbox init: the code that
// runs as pid 1 of each sandbox, from the config the backend sends on
// its pipe to the command's exec and its end (the mounts and pivot_root,
// landlock, the capabilities, no_new_privs and seccomp, the terminal
// relay, the dials for exposed ports, the egress forwarder, the status
// lines), and the wire types of that protocol.
//
// It imports only the standard library, golang.org/x/sys and the
// backends' leaf helpers, never the backend's own side (package backend,
// policy, secrets, the overlay reader, net/http): every sandbox start
// pays the package initialisation of what the init links, and
// cmd/pulse-runtime links this package and the in-box runtime's steps
// (internal/boxrt) alone. Nor package net (it dials and listens through
// internal/bridge's raw sockets): the runtime must not need cgo.
package nsinit
