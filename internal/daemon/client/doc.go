// Package client is the client side of the pulse daemon (package
// daemon): where a user's daemon listens (Dir, Name), how both ends
// check each other (CheckDir, CheckPeer), and Run, which hands one
// command over and waits for its exit.
//
// It is a package of its own so that the thin front end
// (internal/daemon/front), a process that lives a few milliseconds and
// does nothing else, links only this: no net, encoding/json or log/slog
// (the server's), whose initialisers and first use were a third of the
// front end's page faults, and no runtime poller: the socket is used
// with blocking system calls. The wire format is package daemon's (its
// doc.go): the request is written by appendRequest, byte for byte what
// json.Marshal writes, and a reply read by parseReply.
package client
