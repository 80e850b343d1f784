package remote

import (
	"github.com/pulse-agent/pulse/protocol"
)

// The messages, names and formats of the pulse-server protocol are
// package protocol's; this file holds what only the client adds to them.

// reply is the payload of a response or error frame, as call returns it.
type reply struct {
	protocol.Reply
	// isErr: the reply is an error frame.
	isErr bool
}
