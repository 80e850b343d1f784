// Package egress is the proxy that enforces a network allowlist for a
// sandboxed command, and injects secrets bound to hosts.
//
// A command in allowlist mode has no route and no resolver: its only way
// out is this proxy, which Pulse runs outside the sandbox and bridges in
// (a socket in the sandbox's empty network namespace, see the namespace
// and docker backends). The command finds it through HTTP_PROXY,
// HTTPS_PROXY and ALL_PROXY (and their lower-case forms).
//
// What the proxy promises, per connection:
//
//   - HTTP CONNECT, plain-HTTP forwarding and SOCKS5 CONNECT (on the same
//     socket: a first byte of 5 is SOCKS; no authentication; BIND and UDP
//     ASSOCIATE are refused; socks.go). A CONNECT target must be
//     host:port; a plain-HTTP request must carry an absolute http:// URI
//     whose host and port agree with its one Host header; a SOCKS5 name is
//     resolved by the proxy, never by the command, and goes through the
//     same checks as a CONNECT target.
//   - The destination is checked against the policy (policy.NetworkPolicy
//     CheckHost) before anything else; a name not in the allowlist is
//     never looked up, so DNS carries nothing out. A listed name is
//     resolved by the proxy and each address checked (CheckResolved): a
//     name rebound into loopback, link-local or private ranges is refused
//     unless those addresses are listed. The proxy dials the address it
//     checked, never the name again.
//   - Inside an allowed tunnel, the first bytes are inspected: a TLS
//     ClientHello must name the CONNECT host (SNI), or, for a CONNECT to an
//     address, a host the allowlist allows; the rest of a TLS tunnel is
//     not read. A tunnel whose first line names HTTP/1.x is read request
//     by request for as long as it lasts (a server shared by many names
//     serves whichever a request names, on any request of a kept-alive
//     connection): every request's Host header must name the tunnel's
//     host (or, for an address, an allowed host), a CONNECT or an
//     absolute-form request relayed to a second target is cut, and so is
//     what does not parse as HTTP/1. Each request is written upstream as
//     the proxy parsed it. Only a websocket upgrade asked by the first
//     request and answered 101 leaves the rest unread; other Upgrade
//     headers are dropped. Any other protocol (first bytes neither TLS
//     nor HTTP/1) is relayed unread: only its TCP destination is
//     enforced.
//   - A refusal is an HTTP 403 with the header X-Pulse-Egress: denied and
//     a short body of stable lines: what was blocked, by which rule, how
//     to allow it, and that retrying will not help (SOCKS5: reply 2, "not
//     allowed by ruleset", with the reason in the Event only). A refusal
//     after the tunnel is open (SNI, relay) closes the connection.
//   - What the proxy cannot read is refused the same way, with an Event
//     and an answer: a malformed or incomplete HTTP request head (or one
//     over 64 KiB) gets a 400 with X-Pulse-Egress: denied; a malformed
//     SOCKS5 handshake its SOCKS5 failure reply; SOCKS4 and SOCKS4a
//     (first byte 4) are not spoken and get reply 91, "request rejected".
//     The reason's text is bounded and nothing else of the bytes is kept.
//     A connection that closes or times out before sending a byte asked
//     for nothing and is not an Event.
//   - One Event per connection (per request for plain HTTP and inside
//     terminated tunnels): host, port, dialled address, decision, rule or
//     reason, bytes each way. The facade turns each into an audit
//     `network` event, scrubbed like every other.
//
// Secret injection: an Injection binds a secret to host names. The command's
// environment holds a random placeholder (NewPlaceholder); the proxy
// replaces it with the real value in the request headers of requests to
// the bound hosts, and nowhere else. CONNECTs to bound hosts are TLS-
// terminated with a per-sandbox CA (NewCA; its key stays in this process,
// its certificate goes to the command's trust store) and the real server is
// verified against Config.UpstreamRoots; every other host is tunnelled
// untouched. A placeholder in a URL, in a plain-HTTP request to an unbound
// host, or in the clear bytes of a tunnel to an unbound host is refused and
// audited. What cannot be seen is not checked: the body of a request, and
// the contents of TLS tunnels to unbound hosts (a placeholder there is
// worthless: it is not the secret). What a bound host answers is
// scrubbed: every injected value in its header, body and trailer is put
// back as its placeholder before the command reads it, so a server that
// echoes the credential (an error quoting it, a page listing headers)
// hands the command the placeholder. For that a request to a bound host
// asks for no content coding and no range, and an answer that is encoded
// or partial anyway is withheld (a 502 with X-Pulse-Egress:
// answer-withheld; scrub.go).
//
// Names in tests are mapped by Config.Resolver (the documented resolver
// override), so no test looks anything up off the machine.
package egress
