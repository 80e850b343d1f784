package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-agent/pulse/policy"
)

// ErrClosed is returned by Serve once Close was called.
var ErrClosed = errdefs.New("egress: proxy closed", errdefs.ErrClosed)

// Resolver looks host names up. *net.Resolver is one; tests map names to
// their own 127.0.0.1 servers with a fixed table.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Event is what the proxy reports about one connection (for plain HTTP,
// one request): where it went, whether it was allowed, by which rule or
// why not, and how many bytes passed each way. The facade writes one audit
// `network` event per Event.
type Event struct {
	// Method is CONNECT, or the HTTP method of a plain-HTTP request.
	Method string
	Host   string
	Port   int
	// Addr is the address dialled ("" when nothing was).
	Addr string
	// Allowed is the decision; Rule the allowlist entry that allowed the
	// destination, or Reason why it was refused (or failed after being
	// allowed). A refusal with Rule set was for what the command sent to
	// an allowed destination (a request in a tunnel naming another host,
	// a secret's placeholder bound to other hosts), not for where it went.
	Allowed bool
	Rule    string
	Reason  string
	// Injected names the secrets put into the request's headers.
	Injected []string
	// Sent and Received count the bytes the command sent and received
	// through this connection.
	Sent, Received int64
	Duration       time.Duration
}

// Config is a proxy's policy and plumbing.
type Config struct {
	// Policy is what commands may reach; allow-all, deny-all and
	// allowlist are all enforced (deny-all refuses everything).
	Policy policy.NetworkPolicy
	// Inject are the secrets bound to hosts. Each bound host reached over
	// CONNECT has its TLS terminated with CA; every other host is
	// tunnelled untouched.
	Inject []Injection
	// CA signs the certificates shown for bound hosts; required when
	// Inject is not empty.
	CA *CA
	// UpstreamRoots verify the real servers of bound hosts; nil means the
	// system roots.
	UpstreamRoots *x509.CertPool
	// Resolver looks names up; nil means net.DefaultResolver.
	Resolver Resolver
	// Dial connects to a checked address ("ip:port"); nil means a
	// net.Dialer with a 10 s timeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnEvent receives every Event, from the connection's goroutine; it
	// must not block for long.
	OnEvent func(Event)
	// Logger; nil discards.
	Logger *slog.Logger
}

// Proxy is an HTTP proxy (CONNECT and plain-HTTP forwarding) that lets a
// request through only when the policy allows its destination, checked
// on every name a request carries and on every address it resolves to.
type Proxy struct {
	cfg       Config
	transport *http.Transport
	// scrub replaces the secrets' values in what bound hosts answer.
	scrub *scrubber
	// ctx ends with Close, and with it every dial, lookup, round trip
	// and tunnel still running.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// headerTimeout bounds how long a client may take to send a request head.
const headerTimeout = 30 * time.Second

// New checks cfg and returns a proxy; call Serve with a listener.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	if len(cfg.Inject) > 0 && cfg.CA == nil {
		return nil, errors.New("egress: secrets to inject need a CA")
	}
	for _, in := range cfg.Inject {
		if in.Placeholder == "" || in.Value == "" || strings.Contains(in.Value, in.Placeholder) {
			return nil, fmt.Errorf("egress: injection %s needs a placeholder and a value", in.Name)
		}
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
	if len(cfg.Inject) > 0 {
		p.scrub = newScrubber(cfg.Inject)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.transport = &http.Transport{
		DialContext:           p.dialChecked,
		DisableCompression:    true,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		TLSClientConfig:       &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
	}
	return p, nil
}

// Serve accepts connections on l until Close; it always returns an error
// (ErrClosed after Close). Serve may be called on several listeners.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	p.lns[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.lns, l)
		p.mu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("egress: accept: %w", err)
		}
		if !p.track(c) {
			c.Close()
			return ErrClosed
		}
		go func() {
			defer p.untrack(c)
			p.serveConn(c)
		}()
	}
}

// ServeConn handles one connection a bridge accepted elsewhere, and
// closes it.
func (p *Proxy) ServeConn(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	defer p.untrack(c)
	p.serveConn(c)
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	closeConn(c)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.wg.Done()
}

// Lingering before a close: how long, and how much of what the command
// still sends is read away.
const (
	lingerTimeout = 2 * time.Second
	lingerBytes   = 1 << 20
)

// closeConn ends a connection the command may still be writing to. A TCP
// socket closed with input unread sends a reset, and a reset can discard
// what the command has not read yet: a refusal's explanation, a SOCKS
// reply, the last bytes of a tunnel. So the write side is shut first (the
// command reads to the end) and what the command still sends is read away
// for a moment before the close. Close cuts the wait short: it closes
// every tracked connection, and this one is tracked until it returns.
func closeConn(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
		_, _ = io.CopyN(io.Discard, c, lingerBytes)
	}
	c.Close()
}

// Close stops every listener and connection and waits for their
// goroutines. Close is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	for l := range p.lns {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.transport.CloseIdleConnections()
	return nil
}

func (p *Proxy) emit(e Event) {
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(e)
	}
}

// countConn counts the bytes that pass a connection each way.
type countConn struct {
	net.Conn
	in, out atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

// bufConn reads what a bufio.Reader already holds before the connection.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (p *Proxy) serveConn(raw net.Conn) {
	c := &countConn{Conn: raw}
	br := bufio.NewReaderSize(c, 64<<10)
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	if first, err := br.Peek(1); err == nil && first[0] == socksVersion {
		p.serveSOCKS(ctx, c, br) // socks.go
		return
	} else if err == nil && first[0] == 4 {
		p.serveSOCKS4(c, br)
		return
	}
	p.serveRequests(ctx, c, br, nil)
}

// tunnel is the CONNECT target a TLS-terminated connection belongs to.
type tunnel struct {
	host string
	port int
	tls  bool
}

// serveRequests reads requests from br until the connection ends: a
// CONNECT (only outside a tunnel) or plain-HTTP requests, which must be in
// absolute form outside a tunnel and name the tunnel's host inside one.
func (p *Proxy) serveRequests(ctx context.Context, c *countConn, br *bufio.Reader, tun *tunnel) {
	for {
		start := time.Now()
		// What br holds already is this request's (or the next's),
		// not the last one's.
		sent0, recv0 := c.in.Load()-int64(br.Buffered()), c.out.Load()
		_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
		// A connection that ends or times out between requests has
		// asked for nothing; one that sent part of a request, or bytes
		// that are not one, is refused and told why.
		if _, err := br.Peek(1); err != nil {
			return
		}
		hosts, err := hostHeaders(br)
		if err != nil {
			p.badRequest(c, tun, start, sent0, recv0, "an incomplete request head: "+err.Error())
			return
		}
		if len(hosts) > 1 {
			// net/http refuses this too, silently; say why.
			body := denialBody("a request with more than one Host header", "", 0, "more than one Host header")
			_, _ = c.Write(denialResponse(body))
			p.emit(Event{Method: "HTTP", Reason: "more than one Host header", Duration: time.Since(start)})
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			p.badRequest(c, tun, start, sent0, recv0, "a malformed HTTP request: "+clip(err.Error(), 120))
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		ev := Event{Method: req.Method}
		emitted := false
		finish := func() {
			if emitted {
				return
			}
			emitted = true
			ev.Sent, ev.Received = c.in.Load()-sent0, c.out.Load()-recv0
			ev.Duration = time.Since(start)
			p.emit(ev)
		}
		deny := func(what, host string, port int, reason string) {
			ev.Host, ev.Port, ev.Allowed, ev.Reason = host, port, false, reason
			_, _ = c.Write(denialResponse(denialBody(what, host, port, reason)))
			finish()
		}
		if req.Method == http.MethodConnect {
			if tun != nil {
				deny("CONNECT "+req.RequestURI+" inside a tunnel", tun.host, tun.port, "a CONNECT inside a tunnel would reach a second target")
				return
			}
			p.connect(ctx, c, br, req, &ev, deny, finish)
			return
		}
		host, port, reason := requestTarget(req, hosts, tun)
		if reason != "" {
			deny(req.Method+" "+req.RequestURI, host, port, reason)
			return
		}
		keep := p.forward(ctx, c, req, host, port, tun, &ev, deny)
		finish()
		if !keep {
			return
		}
	}
}

// badRequest refuses bytes that are not a request the proxy can read:
// a 400 marked as the proxy's, and an Event with the reason. Nothing of
// what was sent is kept beyond the reason's bounded text.
func (p *Proxy) badRequest(c *countConn, tun *tunnel, start time.Time, sent0, recv0 int64, reason string) {
	ev := Event{Method: "HTTP", Reason: reason}
	if tun != nil {
		ev.Host, ev.Port = tun.host, tun.port
	}
	body := fmt.Sprintf("pulse egress: refused %s\nrule: the proxy reads HTTP/1.1 requests (an absolute http:// URI, or CONNECT host:port) and SOCKS5\nretrying will not help: send a well-formed request\n", reason)
	_, _ = fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\n%s: denied\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", DeniedHeader, len(body), body)
	ev.Sent, ev.Received = c.in.Load()-sent0, c.out.Load()-recv0
	ev.Duration = time.Since(start)
	p.emit(ev)
}

// clip shortens s to at most n bytes (a parse error can quote a whole
// line the client sent).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}

// hostHeaders returns the Host header values of the request head at the
// front of br, which net/http folds into one field and drops: the proxy
// needs them all to see a request whose URI and Host header disagree.
func hostHeaders(br *bufio.Reader) ([]string, error) {
	if _, err := br.Peek(1); err != nil {
		return nil, err
	}
	var head []byte
	for {
		b, _ := br.Peek(br.Buffered())
		if i := headEnd(b); i >= 0 {
			head = b[:i]
			break
		}
		if br.Buffered() == br.Size() {
			return nil, errors.New("request head too large")
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil, err
		}
	}
	var hosts []string
	for _, line := range bytes.Split(head, []byte("\n"))[1:] {
		k, v, ok := bytes.Cut(bytes.TrimRight(line, "\r"), []byte(":"))
		if ok && strings.EqualFold(string(bytes.TrimSpace(k)), "host") {
			hosts = append(hosts, string(bytes.TrimSpace(v)))
		}
	}
	return hosts, nil
}

// headEnd returns the length of the request head at the start of b (up to
// the first empty line, "\r\n" or a bare "\n", as net/http reads it), or
// -1 when b does not hold a whole head yet.
func headEnd(b []byte) int {
	for off := 0; off < len(b); {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			return -1
		}
		line := b[off : off+i]
		if off > 0 && (len(line) == 0 || len(line) == 1 && line[0] == '\r') {
			return off
		}
		off += i + 1
	}
	return -1
}

// requestTarget is where a plain-HTTP request goes, or why it may not.
func requestTarget(req *http.Request, hosts []string, tun *tunnel) (string, int, string) {
	if len(hosts) > 1 {
		return "", 0, "more than one Host header"
	}
	if tun != nil {
		if req.URL.IsAbs() {
			return tun.host, tun.port, "an absolute URI inside a tunnel would relay to another target"
		}
		if len(hosts) == 1 {
			h, p, err := splitHost(hosts[0], tun.port)
			if err != nil || !sameHost(h, tun.host) || p != tun.port {
				return tun.host, tun.port, fmt.Sprintf("the Host header %q does not name the tunnel's host %s", hosts[0], net.JoinHostPort(tun.host, strconv.Itoa(tun.port)))
			}
		}
		return tun.host, tun.port, ""
	}
	if !req.URL.IsAbs() || req.URL.Host == "" {
		return "", 0, "a request to the proxy must carry an absolute http:// URI (set HTTP_PROXY, or use CONNECT)"
	}
	if req.URL.Scheme != "http" {
		return "", 0, fmt.Sprintf("scheme %q is not forwarded (use CONNECT for https)", req.URL.Scheme)
	}
	host, port, err := splitHost(req.URL.Host, 80)
	if err != nil {
		return req.URL.Host, 0, "malformed host in the URI"
	}
	if len(hosts) == 1 {
		h, p, err := splitHost(hosts[0], 80)
		if err != nil || !sameHost(h, host) || p != port {
			return host, port, fmt.Sprintf("the Host header %q and the URI's host %s disagree", hosts[0], req.URL.Host)
		}
	}
	return host, port, ""
}

// splitHost splits "host[:port]" ("[v6]:port" too) with a default port.
func splitHost(s string, def int) (string, int, error) {
	if s == "" {
		return "", 0, errors.New("empty host")
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		// No port.
		host, portStr = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"), strconv.Itoa(def)
		if strings.ContainsAny(host, "[]") || strings.Contains(host, ":") && !isIP(host) {
			return "", 0, errors.New("malformed host")
		}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 || host == "" {
		return "", 0, errors.New("malformed port")
	}
	if strings.ContainsAny(host, " /\\@%?#\x00") {
		return "", 0, errors.New("malformed host")
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" {
		return "", 0, errors.New("empty host")
	}
	return host, port, nil
}

func isIP(s string) bool { _, err := netip.ParseAddr(s); return err == nil }

func sameHost(a, b string) bool {
	a, b = strings.TrimSuffix(strings.ToLower(a), "."), strings.TrimSuffix(strings.ToLower(b), ".")
	if x, err := netip.ParseAddr(a); err == nil {
		y, err := netip.ParseAddr(b)
		return err == nil && x.Unmap() == y.Unmap()
	}
	return a == b
}

// check decides whether host:port may be reached and returns the address
// to dial: the name is checked first (an unlisted name is never looked
// up), then every address it resolves to, and only an address that
// passed is dialled, so a name rebound between the check and the dial
// cannot lead anywhere else.
func (p *Proxy) check(ctx context.Context, host string, port int) (netip.AddrPort, policy.NetworkCheck) {
	pol := p.cfg.Policy
	if a, err := netip.ParseAddr(host); err == nil {
		chk := pol.CheckHost(host, port)
		return netip.AddrPortFrom(a.Unmap(), uint16(port)), chk
	}
	chk := pol.CheckHost(host, port)
	if !chk.Allowed {
		return netip.AddrPort{}, chk
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := p.cfg.Resolver.LookupNetIP(lctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return netip.AddrPort{}, policy.NetworkCheck{Reason: fmt.Sprintf("%s did not resolve", host)}
	}
	var refused policy.NetworkCheck
	for _, a := range addrs {
		rc := pol.CheckResolved(host, a, port)
		if rc.Allowed {
			return netip.AddrPortFrom(a.Unmap(), uint16(port)), rc
		}
		refused = rc
	}
	return netip.AddrPort{}, refused
}

type targetKey struct{}

// dialChecked is the transport's dialer: it dials only the address check
// approved for this request, carried in the context.
func (p *Proxy) dialChecked(ctx context.Context, network, _ string) (net.Conn, error) {
	ap, ok := ctx.Value(targetKey{}).(netip.AddrPort)
	if !ok || !ap.IsValid() {
		return nil, errors.New("egress: no checked address for this dial")
	}
	return p.cfg.Dial(ctx, "tcp", ap.String())
}

// forward sends one plain-HTTP request (or one request inside a
// TLS-terminated tunnel) upstream and copies the response back. It
// reports whether the client connection may carry another request.
func (p *Proxy) forward(ctx context.Context, c *countConn, req *http.Request, host string, port int, tun *tunnel, ev *Event, deny func(what, host string, port int, reason string)) bool {
	what := req.Method + " " + req.URL.String()
	if tun != nil {
		what = req.Method + " https://" + net.JoinHostPort(host, strconv.Itoa(port)) + req.URL.RequestURI()
	}
	target, chk := p.check(ctx, host, port)
	ev.Host, ev.Port = host, port
	if !chk.Allowed {
		deny(what, host, port, chk.Reason)
		return false
	}
	// The destination is allowed: a refusal from here on is for what the
	// request carries, and Rule says so.
	ev.Rule = chk.Rule
	if strays := placeholdersIn(p.cfg.Inject, req.URL.String()); len(strays) > 0 {
		deny(what, host, port, fmt.Sprintf("the placeholder of secret %s is in the URL; it is put only into headers to its bound hosts", strays[0].Name))
		return false
	}
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		req.Header.Del(h)
	}
	injected, stray := inject(p.cfg.Inject, req.Header, host)
	if stray != nil {
		deny(what, host, port, fmt.Sprintf("the placeholder of secret %s is bound to other hosts; it does not leave for %s", stray.Name, host))
		return false
	}
	ev.Allowed, ev.Rule, ev.Addr, ev.Injected = true, chk.Rule, target.String(), injected
	out := req.Clone(context.WithValue(ctx, targetKey{}, target))
	out.RequestURI = ""
	scheme := "http"
	if tun != nil && tun.tls {
		scheme = "https"
	}
	out.URL.Scheme, out.URL.Host = scheme, net.JoinHostPort(host, strconv.Itoa(port))
	if (scheme == "http" && port == 80) || (scheme == "https" && port == 443) {
		out.URL.Host = host
		if isIP(host) && strings.Contains(host, ":") {
			out.URL.Host = "[" + host + "]"
		}
	}
	out.Host = out.URL.Host
	out.Close = false
	// A bound host's answer is scrubbed of the secrets' values (scrub.go).
	var scrub *scrubber
	if p.bound(host) {
		scrub = p.scrub
		prepareForScrub(out.Header)
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		ev.Reason = scrub.str("upstream: " + err.Error())
		body := scrub.str(fmt.Sprintf("pulse egress: %s was allowed, but the upstream failed: %v\n", what, err))
		_, _ = fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n%s: upstream-failed\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", DeniedHeader, len(body), body)
		return false
	}
	defer resp.Body.Close()
	if scrub != nil {
		if why := unscrubbable(resp); why != "" {
			ev.Reason = "answer withheld: " + why
			body := fmt.Sprintf("pulse egress: %s was sent, but its answer is withheld: %s\n", what, why)
			_, _ = fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n%s: answer-withheld\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", DeniedHeader, len(body), body)
			return false
		}
		scrub.response(resp, out.Method)
	}
	keep := !req.Close && !resp.Close
	if err := resp.Write(c); err != nil {
		return false
	}
	return keep && !resp.Close
}

// connect handles a CONNECT: check the target, dial the checked address,
// then watch the first bytes the command sends through the tunnel: a TLS
// ClientHello must name the same host (or an allowed one, when the target
// is an address), and an HTTP request relaying to another target is
// refused. A host with bound secrets has its TLS terminated instead.
func (p *Proxy) connect(ctx context.Context, c *countConn, br *bufio.Reader, req *http.Request, ev *Event,
	deny func(what, host string, port int, reason string), finish func()) {
	what := "CONNECT " + req.RequestURI
	host, port, err := splitHost(req.RequestURI, 0)
	if err != nil {
		deny(what, req.RequestURI, 0, "the CONNECT target must be host:port")
		return
	}
	p.tunnel(ctx, c, br, what, host, port, httpReplies, ev, deny, finish)
}

// replies are what a tunnel's client is told once its target is allowed:
// HTTP for CONNECT, SOCKS5 replies for SOCKS (socks.go). Refusals go
// through the caller's deny.
type replies struct {
	established    []byte
	upstreamFailed func(w io.Writer, what string, err error)
}

var httpReplies = replies{
	established: []byte("HTTP/1.1 200 Connection established\r\n\r\n"),
	upstreamFailed: func(w io.Writer, what string, err error) {
		body := fmt.Sprintf("pulse egress: %s was allowed, but the upstream failed: %v\n", what, err)
		_, _ = fmt.Fprintf(w, "HTTP/1.1 502 Bad Gateway\r\n%s: upstream-failed\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", DeniedHeader, len(body), body)
	},
}

// tunnel checks host:port, dials the checked address and relays, for a
// CONNECT or a SOCKS5 CONNECT alike.
func (p *Proxy) tunnel(ctx context.Context, c *countConn, br *bufio.Reader, what, host string, port int, rp replies, ev *Event,
	deny func(what, host string, port int, reason string), finish func()) {
	target, chk := p.check(ctx, host, port)
	ev.Host, ev.Port = host, port
	if !chk.Allowed {
		deny(what, host, port, chk.Reason)
		return
	}
	ev.Allowed, ev.Rule, ev.Addr = true, chk.Rule, target.String()
	if p.bound(host) {
		p.terminate(ctx, c, br, host, port, rp, finish)
		return
	}
	up, err := p.cfg.Dial(ctx, "tcp", target.String())
	if err != nil {
		ev.Reason = "upstream: " + err.Error()
		rp.upstreamFailed(c, what, err)
		finish()
		return
	}
	defer up.Close()
	// An upstream that neither sends nor closes must not outlive the
	// proxy (or this connection).
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	if _, err := c.Write(rp.established); err != nil {
		finish()
		return
	}
	// Server-first protocols need the upstream's bytes before the
	// command sends any: copy that way at once.
	down := make(chan struct{})
	// switched: the upstream's first bytes are a 101, the answer to a
	// plain tunnel's first request when it asked for an upgrade.
	var switched atomic.Bool
	go func() {
		var n int64
		first := make([]byte, 512)
		k, err := up.Read(first)
		switched.Store(bytes.HasPrefix(first[:k], []byte("HTTP/1.1 101 ")))
		if k > 0 {
			k, err = c.Conn.Write(first[:k])
			n += int64(k)
		}
		if err == nil {
			// Straight between the raw connections, so the kernel can
			// splice.
			m, _ := io.Copy(c.Conn, up)
			n += m
		}
		c.out.Add(n)
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		close(down)
	}()
	if reason := p.inspectTunnel(br, host, port); reason != "" {
		ev.Allowed, ev.Reason = false, reason
		up.Close() // ends the copy down, which shuts c's write side
		<-down
		finish()
		return
	}
	var cerr error
	var dst io.Writer = up
	if len(p.cfg.Inject) > 0 {
		dst = &strayWriter{w: up, ins: p.cfg.Inject}
	}
	if originForm(br) {
		var reason string
		reason, cerr = p.relayRequests(br, dst, host, port, switched.Load)
		if reason != "" {
			ev.Allowed, ev.Reason = false, reason
			up.Close()
			<-down
			finish()
			return
		}
	} else if len(p.cfg.Inject) > 0 {
		_, cerr = io.Copy(dst, br)
	} else if _, cerr = io.CopyN(up, br, int64(br.Buffered())); cerr == nil {
		n, err := io.Copy(up, c.Conn)
		c.in.Add(n)
		cerr = err
	}
	var se *strayError
	if errors.As(cerr, &se) {
		ev.Allowed, ev.Reason = false, fmt.Sprintf("the placeholder of secret %s is bound to other hosts; it does not leave for %s", se.name, host)
		up.Close() // as above; the rest the command sends is read away (closeConn), never forwarded
	}
	if cw, ok := up.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	<-down
	finish()
}

// inspectTunnel looks at the first bytes the command sends through an
// allowed tunnel and returns why they must not pass ("" when they may).
func (p *Proxy) inspectTunnel(br *bufio.Reader, host string, port int) string {
	first, err := br.Peek(1)
	if err != nil {
		return ""
	}
	if first[0] == 0x16 {
		hdr, err := br.Peek(5)
		if err != nil {
			return "a truncated TLS record"
		}
		n, _ := helloLen(hdr)
		if n > maxRecord || n > br.Size() {
			return "an oversized TLS record"
		}
		rec, err := br.Peek(n)
		if err != nil {
			return "a truncated TLS ClientHello"
		}
		sni, err := serverName(rec)
		if err != nil {
			return "a TLS ClientHello whose server name cannot be read"
		}
		switch {
		case sni == "":
		case isIP(host):
			if !p.cfg.Policy.CheckHost(sni, port).Allowed {
				return fmt.Sprintf("the TLS server name %q is not in the allowlist", sni)
			}
		case !sameHost(sni, host):
			return fmt.Sprintf("the TLS server name %q differs from the CONNECT host %s", sni, host)
		}
		return ""
	}
	// An HTTP request relayed through the tunnel to a second target: a
	// CONNECT, or a request line in absolute form.
	b, _ := br.Peek(min(br.Buffered(), 1024))
	line, _, _ := bytes.Cut(b, []byte("\n"))
	if m, rest, ok := bytes.Cut(line, []byte(" ")); ok && isToken(m) {
		if bytes.Equal(m, []byte("CONNECT")) {
			return "a CONNECT inside a tunnel would reach a second target"
		}
		lower := bytes.ToLower(rest)
		if bytes.HasPrefix(lower, []byte("http://")) || bytes.HasPrefix(lower, []byte("https://")) {
			return "an absolute URI inside a tunnel would relay to another target"
		}
		// A plain request in the tunnel must name the tunnel's host, or a
		// server shared by many names would serve another (fronting).
		// This is the first request; relayRequests checks every one.
		if bytes.HasPrefix(rest, []byte("/")) && bytes.Contains(rest, []byte(" HTTP/")) {
			hosts, err := hostHeaders(br)
			if err != nil {
				return "an unreadable HTTP request head"
			}
			for _, h := range hosts {
				hh, hp, err := splitHost(h, port)
				named := err == nil && hp == port && (sameHost(hh, host) || isIP(host) && p.cfg.Policy.CheckHost(hh, port).Allowed)
				if !named {
					return fmt.Sprintf("the Host header %q does not name the tunnel's host %s", h, net.JoinHostPort(host, strconv.Itoa(port)))
				}
			}
			if len(hosts) > 1 {
				return "more than one Host header"
			}
		}
	}
	return ""
}

// originForm reports whether br starts with what a server could take for
// an HTTP/1 request: a first line (after the empty lines servers skip)
// that names HTTP/1.x, whatever its method's case or spacing. It reads
// on until that line is whole, for as long as what came could still be
// one (no control byte), however the command cut it into writes: a line
// decided on its first bytes alone ("G") would let every request pass
// unread. A line that fills the buffer is taken as a request, which the
// proxy then cannot read and refuses.
func originForm(br *bufio.Reader) bool {
	httpLine := func(line []byte) bool { return bytes.Contains(line, []byte("HTTP/1.")) }
	start, i := -1, 0
	for {
		b, _ := br.Peek(br.Buffered())
		for ; i < len(b); i++ {
			c := b[i]
			if start < 0 {
				if c == '\r' || c == '\n' {
					continue
				}
				start = i
			}
			if c == '\n' {
				return httpLine(b[start:i])
			}
			if c < 0x20 && c != '\t' && c != '\r' {
				return httpLine(b[start:i])
			}
		}
		if len(b) >= br.Size() {
			return true
		}
		if _, err := br.Peek(len(b) + 1); err != nil {
			b, _ = br.Peek(br.Buffered()) // the buffer may have slid
			return start >= 0 && httpLine(b[start:])
		}
	}
}

// skipEmptyLines consumes the CR and LF bytes at the front of br, which
// servers skip before a request line.
func skipEmptyLines(br *bufio.Reader) error {
	for {
		b, err := br.Peek(1)
		if err != nil {
			return err
		}
		if b[0] != '\r' && b[0] != '\n' {
			return nil
		}
		_, _ = br.Discard(1)
	}
}

// relayRequests relays the HTTP/1 requests of a plain tunnel to dst one
// at a time, each checked as the first one is: its Host header must name
// the tunnel's host (a server shared by many names serves whichever a
// request names, on any request of a kept-alive connection), and it may
// not relay to a second target (CONNECT, absolute URI). Each request is
// written out again from what net/http parsed, so the server frames it
// as the proxy did: no request can hide in a body the two would measure
// differently. An upgrade is kept only for a websocket asked by the
// tunnel's first request: once the upstream has answered it with a 101
// (switched), the rest is relayed unread; any other Upgrade header (h2c
// would carry requests the proxy does not read) is dropped. It returns
// why the tunnel is cut, or the error that ended it.
func (p *Proxy) relayRequests(br *bufio.Reader, dst io.Writer, host string, port int, switched func() bool) (string, error) {
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	websocket := false
	for n := 0; ; n++ {
		// The upstream's answer is looked at once the command sends
		// more: a websocket client waits for the 101 before it does.
		if _, err := br.Peek(1); err != nil {
			return "", nil
		}
		if n == 1 && websocket && switched() {
			_, err := io.Copy(dst, br)
			return "", err
		}
		if err := skipEmptyLines(br); err != nil {
			return "", nil
		}
		hosts, err := hostHeaders(br)
		if err != nil {
			return "an unreadable HTTP request head in the tunnel", nil
		}
		if len(hosts) > 1 {
			return "more than one Host header", nil
		}
		for _, h := range hosts {
			hh, hport, err := splitHost(h, port)
			if err != nil || hport != port || !sameHost(hh, host) && !(isIP(host) && p.cfg.Policy.CheckHost(hh, port).Allowed) {
				return fmt.Sprintf("the Host header %q does not name the tunnel's host %s", h, hp), nil
			}
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return "a malformed HTTP request in the tunnel: " + clip(err.Error(), 120), nil
		}
		switch {
		case req.Method == http.MethodConnect:
			return "a CONNECT inside a tunnel would reach a second target", nil
		case req.URL.IsAbs() || req.URL.Host != "":
			return "an absolute URI inside a tunnel would relay to another target", nil
		}
		if len(hosts) == 0 {
			req.Host = hp
		}
		if up := req.Header.Values("Upgrade"); len(up) > 0 {
			if n == 0 && len(up) == 1 && strings.EqualFold(strings.TrimSpace(up[0]), "websocket") {
				websocket = true
			} else {
				req.Header.Del("Upgrade")
			}
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // none added
		}
		err = req.Write(dst)
		req.Body.Close()
		if err != nil {
			return "", err
		}
	}
}

func isToken(b []byte) bool {
	if len(b) == 0 || len(b) > 16 {
		return false
	}
	for _, c := range b {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// bound reports whether a secret is bound to host.
func (p *Proxy) bound(host string) bool {
	for _, in := range p.cfg.Inject {
		if in.boundTo(host) {
			return true
		}
	}
	return false
}

// terminate serves a CONNECT to a host with bound secrets: TLS is
// terminated with a certificate from the sandbox CA, and each request is
// checked, has its placeholders replaced and is sent to the real server
// over TLS verified against UpstreamRoots. A command that does not speak
// TLS there gets its plain requests served the same way.
func (p *Proxy) terminate(ctx context.Context, c *countConn, br *bufio.Reader, host string, port int, rp replies, finish func()) {
	if _, err := c.Write(rp.established); err != nil {
		finish()
		return
	}
	finish() // the CONNECT itself; each request inside is an event too
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	if first[0] != 0x16 {
		p.serveRequests(ctx, c, br, &tunnel{host: host, port: port})
		return
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hi.ServerName != "" && !sameHost(hi.ServerName, host) {
				return nil, fmt.Errorf("server name %q differs from the CONNECT host %s", hi.ServerName, host)
			}
			return p.cfg.CA.leaf(host)
		},
	}
	tc := tls.Server(&bufConn{Conn: c, r: br}, cfg)
	_ = tc.SetDeadline(time.Now().Add(headerTimeout))
	if err := tc.HandshakeContext(ctx); err != nil {
		p.emit(Event{Method: "TLS", Host: host, Port: port, Reason: "TLS handshake with the command failed: " + err.Error()})
		return
	}
	_ = tc.SetDeadline(time.Time{})
	inner := &countConn{Conn: tc}
	p.serveRequests(ctx, inner, bufio.NewReaderSize(inner, 64<<10), &tunnel{host: host, port: port, tls: true})
}

// strayWriter refuses a stream that carries a placeholder to a host the
// secret is not bound to (the tunnel's host is never bound: bound hosts
// are terminated, not tunnelled). It keeps the tail of the last write so a
// placeholder split across writes is still seen.
type strayWriter struct {
	w    io.Writer
	ins  []Injection
	tail []byte
}

type strayError struct{ name string }

func (e *strayError) Error() string { return "placeholder of " + e.name + " headed to an unbound host" }

func (s *strayWriter) Write(b []byte) (int, error) {
	buf := append(s.tail, b...)
	for _, in := range s.ins {
		if bytes.Contains(buf, []byte(in.Placeholder)) {
			return 0, &strayError{name: in.Name}
		}
	}
	keep := 0
	for _, in := range s.ins {
		keep = max(keep, len(in.Placeholder)-1)
	}
	if len(buf) > keep {
		s.tail = append(s.tail[:0], buf[len(buf)-keep:]...)
	} else {
		s.tail = append(s.tail[:0], buf...)
	}
	return s.w.Write(b)
}
