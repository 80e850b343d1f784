package egress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// SOCKS5 (RFC 1928), on the same socket as HTTP: a connection whose first
// byte is 5 speaks it. Only CONNECT, without authentication: BIND and UDP
// ASSOCIATE are refused (no UDP leaves the sandbox). The target goes
// through the same checks as an HTTP CONNECT (tunnel): a name is checked
// before it is resolved, the proxy resolves it and checks every address,
// the tunnel's first bytes are inspected, bound hosts are TLS-terminated.
// A SOCKS reply cannot carry the explained refusal: it is code 2
// ("connection not allowed by ruleset"), and the Event says why.

const socksVersion = 5

// SOCKS5 reply codes.
const (
	socksOK              = 0
	socksFailure         = 1
	socksNotAllowed      = 2
	socksHostUnreach     = 4
	socksCmdUnsupported  = 7
	socksAddrUnsupported = 8
)

// errSOCKS is wrapped by every malformed or refused SOCKS handshake.
var errSOCKS = errors.New("socks5")

// socksReply is a reply with code and an unspecified bound address.
func socksReply(code byte) []byte { return []byte{socksVersion, code, 0, 1, 0, 0, 0, 0, 0, 0} }

var socksReplies = replies{
	established:    socksReply(socksOK),
	upstreamFailed: func(w io.Writer, _ string, _ error) { _, _ = w.Write(socksReply(socksHostUnreach)) },
}

// readSOCKS reads a SOCKS5 greeting and request from br, answering the
// greeting on w, and returns the CONNECT target. A handshake it refuses
// gets its reply (no acceptable method, command or address type not
// supported) and an error wrapping errSOCKS; host is then what the
// request named, when it got that far.
func readSOCKS(br *bufio.Reader, w io.Writer) (host string, port int, err error) {
	var hdr [2]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil || hdr[0] != socksVersion {
		return "", 0, fmt.Errorf("%w: not a SOCKS5 greeting", errSOCKS)
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return "", 0, fmt.Errorf("%w: truncated greeting", errSOCKS)
	}
	if !bytes.Contains(methods, []byte{0}) {
		_, _ = w.Write([]byte{socksVersion, 0xff})
		return "", 0, fmt.Errorf("%w: the client offers no method without authentication", errSOCKS)
	}
	if _, err := w.Write([]byte{socksVersion, 0}); err != nil {
		return "", 0, fmt.Errorf("%w: %v", errSOCKS, err)
	}
	var req [4]byte
	if _, err := io.ReadFull(br, req[:]); err != nil {
		return "", 0, fmt.Errorf("%w: truncated request", errSOCKS)
	}
	if req[0] != socksVersion || req[2] != 0 {
		_, _ = w.Write(socksReply(socksFailure))
		return "", 0, fmt.Errorf("%w: malformed request", errSOCKS)
	}
	switch req[3] {
	case 1:
		var a [4]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return "", 0, fmt.Errorf("%w: truncated address", errSOCKS)
		}
		host = netip.AddrFrom4(a).String()
	case 4:
		var a [16]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return "", 0, fmt.Errorf("%w: truncated address", errSOCKS)
		}
		host = netip.AddrFrom16(a).Unmap().String()
	case 3:
		n, err := br.ReadByte()
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("%w: empty name", errSOCKS)
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(br, name); err != nil {
			return "", 0, fmt.Errorf("%w: truncated name", errSOCKS)
		}
		host = string(name)
	default:
		_, _ = w.Write(socksReply(socksAddrUnsupported))
		return "", 0, fmt.Errorf("%w: address type %d", errSOCKS, req[3])
	}
	var pb [2]byte
	if _, err := io.ReadFull(br, pb[:]); err != nil {
		return host, 0, fmt.Errorf("%w: truncated port", errSOCKS)
	}
	port = int(binary.BigEndian.Uint16(pb[:]))
	if req[1] != 1 {
		_, _ = w.Write(socksReply(socksCmdUnsupported))
		return host, port, fmt.Errorf("%w: command %d (only CONNECT is relayed; BIND and UDP ASSOCIATE are not)", errSOCKS, req[1])
	}
	// A name is held to the same form as a CONNECT target's; an IPv6
	// address given as a name is taken as the address.
	h, p, err := splitHost(net.JoinHostPort(host, strconv.Itoa(port)), 0)
	if err == nil && strings.Contains(host, ":") && !isIP(host) {
		err = errors.New("malformed name")
	}
	if err != nil {
		_, _ = w.Write(socksReply(socksNotAllowed))
		return host, port, fmt.Errorf("%w: %v", errSOCKS, err)
	}
	return h, p, nil
}

// serveSOCKS handles a connection that speaks SOCKS5: one CONNECT, then
// the tunnel.
func (p *Proxy) serveSOCKS(ctx context.Context, c *countConn, br *bufio.Reader) {
	start := time.Now()
	ev := Event{Method: "SOCKS5"}
	emitted := false
	finish := func() {
		if emitted {
			return
		}
		emitted = true
		ev.Sent, ev.Received = c.in.Load(), c.out.Load()
		ev.Duration = time.Since(start)
		p.emit(ev)
	}
	deny := func(_ string, host string, port int, reason string) {
		ev.Host, ev.Port, ev.Allowed, ev.Reason = host, port, false, reason
		_, _ = c.Write(socksReply(socksNotAllowed))
		finish()
	}
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	host, port, err := readSOCKS(br, c)
	if err != nil {
		ev.Host, ev.Port, ev.Reason = host, port, err.Error()
		finish()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	what := "SOCKS5 CONNECT " + net.JoinHostPort(host, strconv.Itoa(port))
	p.tunnel(ctx, c, br, what, host, port, socksReplies, &ev, deny, finish)
}

// SOCKS4 and SOCKS4a (a first byte of 4) are not spoken: a SOCKS4 client
// could name an address the proxy cannot see resolved, and there is no
// reason to keep two SOCKS versions. The request is read as far as it
// names a target (bounded: the user ID and name are at most
// socks4Field bytes each), answered with reply 91 ("request rejected or
// failed") and refused with an Event saying why.

const socks4Field = 255

func (p *Proxy) serveSOCKS4(c *countConn, br *bufio.Reader) {
	start := time.Now()
	ev := Event{Method: "SOCKS4", Reason: "SOCKS4 is not supported: use SOCKS5 (socks5h://) or HTTP CONNECT"}
	var req [8]byte
	if _, err := io.ReadFull(br, req[:]); err == nil {
		ev.Port = int(binary.BigEndian.Uint16(req[2:4]))
		ev.Host = netip.AddrFrom4([4]byte(req[4:8])).String()
		// SOCKS4a: an address 0.0.0.x (x > 0) means a name follows the
		// user ID.
		if req[4] == 0 && req[5] == 0 && req[6] == 0 && req[7] != 0 {
			ev.Host = ""
			if _, ok := socks4String(br); ok {
				if name, ok := socks4String(br); ok {
					if h, _, err := splitHost(net.JoinHostPort(name, "1"), 0); err == nil {
						ev.Host = h
					}
				}
			}
		}
	}
	_, _ = c.Write([]byte{0, 91, 0, 0, 0, 0, 0, 0})
	ev.Sent, ev.Received = c.in.Load(), c.out.Load()
	ev.Duration = time.Since(start)
	p.emit(ev)
}

// socks4String reads a NUL-terminated SOCKS4 field of at most
// socks4Field bytes.
func socks4String(br *bufio.Reader) (string, bool) {
	var b []byte
	for len(b) <= socks4Field {
		c, err := br.ReadByte()
		if err != nil {
			return "", false
		}
		if c == 0 {
			return string(b), true
		}
		b = append(b, c)
	}
	return "", false
}
