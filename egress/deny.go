package egress

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DeniedHeader marks a response the proxy wrote itself to refuse a
// request, so a client (or a test) can tell it from an upstream's 403.
const DeniedHeader = "X-Pulse-Egress"

// denialBody is the text of a refusal. Its shape is stable, line by line,
// so an agent can read it: what was blocked, by which rule, how to allow
// it, and that retrying will not help.
func denialBody(what, host string, port int, reason string) string {
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	var b strings.Builder
	fmt.Fprintf(&b, "pulse egress: blocked %s\n", what)
	fmt.Fprintf(&b, "rule: %s\n", reason)
	fmt.Fprintf(&b, "to allow it: add %q to network.allow in the policy, or pass --allow-host %s to pulse exec\n", hp, hp)
	b.WriteString("retrying will not help: this is the sandbox's network policy, not a network error\n")
	return b.String()
}

// denialResponse is a whole HTTP/1.1 403 response carrying body; the
// connection closes after it.
func denialResponse(body string) []byte {
	return []byte(fmt.Sprintf("HTTP/1.1 403 Forbidden\r\n%s: denied\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		DeniedHeader, len(body), body))
}
