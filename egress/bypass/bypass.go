// Package bypass is the egress bypass suite: the ways a command inside a
// sandbox might reach what the network allowlist does not allow, each
// tried for real on a backend. `pulse doctor network` runs it and prints
// what holds; the namespace and docker backends' tests fail on any attack
// that gets through.
//
// It is hermetic: every server is on 127.0.0.1 of this machine (an HTTP
// server, an HTTPS one with its own test CA, and an "evil" server that
// must never be reached), names are mapped by the proxy's resolver
// override (allowed.test, rebind.test, example.com), and the attacks that
// would leave the machine if they succeeded aim at this machine's own
// addresses instead. Commands are bash scripts using /dev/tcp and /dev/udp,
// so they need nothing but bash in the sandbox, except the TLS checks,
// which run curl and report a skip where the sandbox has none
// (scripts/testenv.sh puts the host's curl in the Docker test image, and
// the backends' tests fail on a skip where PULSE_REQUIRE_* says so).
package bypass

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Result is the outcome of one attack (or one thing that must work).
type Result struct {
	Name string
	// Held is true when the sandbox behaved: the allowed request worked,
	// the attack failed.
	Held bool
	// Detail says what was seen.
	Detail string
	// Skipped says why the attack could not be tried ("" when it was).
	Skipped string
}

// realSecret is the value injected for the bound host; the command must
// never see it.
const realSecret = "pulse-bypass-real-secret-7d1f0c2a9b"

type env struct {
	b        backend.Backend
	ws       string
	dir      string
	proxy    *egress.Proxy
	sock     string
	caFile   string
	caPEM    []byte
	httpAddr string
	tlsSrv   *httptest.Server
	evilAddr string
	evilHits atomic.Int64
	seenMu   sync.Mutex
	seen     []string // headers the HTTP server saw
	evMu     sync.Mutex
	events   []egress.Event
	ph       string
	hostIPs  []string
}

type mapResolver map[string]string

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[strings.ToLower(host)]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// Run tries every attack on b and returns the results in order. It fails
// only when it cannot set up (servers, proxy); a backend that cannot run
// allowlist commands at all yields results that did not hold.
func Run(ctx context.Context, b backend.Backend, logger *slog.Logger) ([]Result, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	e := &env{b: b}
	var err error
	if e.dir, err = os.MkdirTemp("", "pulse-bypass-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(e.dir)
	e.ws = filepath.Join(e.dir, "ws")
	if err := os.Mkdir(e.ws, 0o755); err != nil {
		return nil, err
	}
	closeAll, err := e.start()
	if err != nil {
		return nil, err
	}
	defer closeAll()
	var out []Result
	for _, a := range attacks {
		r := a.run(ctx, e)
		r.Name = a.name
		out = append(out, r)
		logger.Debug("bypass", "attack", a.name, "held", r.Held, "detail", r.Detail)
	}
	return out, nil
}

func (e *env) start() (func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) (func(), error) { closeAll(); return nil, err }

	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	e.httpAddr = hl.Addr().String()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.seenMu.Lock()
		e.seen = append(e.seen, fmt.Sprint(r.Header))
		e.seenMu.Unlock()
		if auth := r.Header.Get("Authorization"); auth != "" {
			if r.URL.Path == "/echo" {
				// A server that quotes the credential it got.
				w.Header().Set("X-Echo", auth)
				io.WriteString(w, "pulse-bypass-echo "+auth+"\n")
				return
			}
			if auth == "Bearer "+realSecret {
				io.WriteString(w, "pulse-bypass-authorized\n")
			} else {
				io.WriteString(w, "pulse-bypass-unauthorized\n")
			}
			return
		}
		io.WriteString(w, "pulse-bypass-ok\n")
	}), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(hl)
	closers = append(closers, func() { hs.Close() })

	e.tlsSrv = httptest.NewTLSServer(hs.Handler)
	closers = append(closers, e.tlsSrv.Close)

	el, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	e.evilAddr = el.Addr().String()
	go func() {
		for {
			c, err := el.Accept()
			if err != nil {
				return
			}
			e.evilHits.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\npulse-bypass-evil")
			c.Close()
		}
	}()
	closers = append(closers, func() { el.Close() })

	ca, err := egress.NewCA()
	if err != nil {
		return fail(err)
	}
	e.caPEM = ca.CertPEM()
	bundle := append(backend.SystemRoots(), e.caPEM...)
	e.caFile = filepath.Join(e.dir, "ca.pem")
	if err := os.WriteFile(e.caFile, bundle, 0o644); err != nil {
		return fail(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(e.tlsSrv.Certificate())
	_, hp, _ := net.SplitHostPort(e.httpAddr)
	_, tp, _ := net.SplitHostPort(e.tlsSrv.Listener.Addr().String())
	e.ph = egress.NewPlaceholder("PULSE_BYPASS_TOKEN")
	e.proxy, err = egress.New(egress.Config{
		Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{
			"127.0.0.1:" + hp, "allowed.test:" + hp, "rebind.test:" + hp, "bound.test:" + hp,
			"127.0.0.1:" + tp, "example.com:" + tp,
		}},
		Inject: []egress.Injection{{Name: "PULSE_BYPASS_TOKEN", Value: realSecret, Placeholder: e.ph,
			Hosts: []string{"bound.test", "example.com"}}},
		CA:            ca,
		UpstreamRoots: roots,
		Resolver: mapResolver{"allowed.test": "127.0.0.1", "bound.test": "127.0.0.1", "example.com": "127.0.0.1",
			"rebind.test": "127.0.0.2"},
		OnEvent: func(ev egress.Event) { e.evMu.Lock(); e.events = append(e.events, ev); e.evMu.Unlock() },
	})
	if err != nil {
		return fail(err)
	}
	e.sock = filepath.Join(e.dir, "proxy.sock")
	ul, err := net.Listen("unix", e.sock)
	if err != nil {
		return fail(err)
	}
	go e.proxy.Serve(ul)
	closers = append(closers, func() { e.proxy.Close() })

	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
				e.hostIPs = append(e.hostIPs, p.Addr().String())
			}
		}
	}
	return closeAll, nil
}

// run executes script in the sandbox with the allowlist and the proxy,
// and returns its output.
func (e *env) run(ctx context.Context, script string) (string, int, error) {
	// The backend's copiers may write both streams at once, and a
	// command that outlives Exec may still be writing.
	out := &syncio.Buffer{}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	res, err := e.b.Exec(ctx, &backend.Request{
		Workspace: e.ws,
		Shell:     script,
		Env:       map[string]string{"PULSE_BYPASS_TOKEN": e.ph},
		Stdout:    out,
		Stderr:    out,
		Limits:    policy.ResourceLimits{Timeout: 30 * time.Second},
		Network:   policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"127.0.0.1:1"}},
		Secrets:   secrets.Policy{Mode: secrets.AllowAll},
		// ServeConn as the sandbox package sets it, so a backend that
		// hands connections to the proxy in process is attacked that way.
		Egress: &backend.Egress{Socket: e.sock, ServeConn: e.proxy.ServeConn, CAFile: e.caFile, CA: e.caPEM},
	})
	if err != nil {
		return "", -1, err
	}
	return out.String(), res.ExitCode, nil
}

// prelude defines px (open fd 3 to the proxy named by HTTP_PROXY), send
// (send a printf format to it, print the answer) and socks (send a
// SOCKS5 greeting and request, then $2; print the reply's first four
// bytes in hex as "SOCKS 05 00 05 CODE", then the rest).
const prelude = `p=${HTTP_PROXY#http://}; p=${p%/}; ph=${p%:*}; pp=${p##*:}
px() { exec 3<>/dev/tcp/$ph/$pp || { echo NO-PROXY; exit 0; }; }
send() { px; printf "$1" >&3; timeout 10 cat <&3; exec 3<&-; }
socks() { px; f=$(mktemp); printf "\x05\x01\x00$1$2" >&3; timeout 10 cat <&3 > "$f"; exec 3<&-
  echo SOCKS $(head -c 4 "$f" | od -An -tx1); tail -c +11 "$f"; rm -f "$f"; }
`

type attack struct {
	name string
	run  func(ctx context.Context, e *env) Result
}

// expect runs script and holds when out contains want and none of bad.
func expect(script string, want []string, bad ...string) func(ctx context.Context, e *env) Result {
	return func(ctx context.Context, e *env) Result {
		s := e.expand(script)
		out, _, err := e.run(ctx, prelude+s)
		if err != nil {
			return Result{Detail: "could not run: " + err.Error()}
		}
		for _, w := range want {
			if !strings.Contains(out, e.expand(w)) {
				return Result{Detail: fmt.Sprintf("missing %q in %q", e.expand(w), clip(out))}
			}
		}
		for _, b := range bad {
			if strings.Contains(out, e.expand(b)) {
				return Result{Detail: fmt.Sprintf("got %q in %q", e.expand(b), clip(out))}
			}
		}
		if n := e.evilHits.Swap(0); n > 0 {
			return Result{Detail: fmt.Sprintf("the evil server was reached %d times", n)}
		}
		return Result{Held: true, Detail: firstLine(out)}
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return clip(strings.TrimSpace(l))
}

// expand fills in the test addresses: HTTP (allowed), EVIL (never
// allowed), their ports, and the first of the host's own addresses.
func (e *env) expand(s string) string {
	hh, hp, _ := net.SplitHostPort(e.httpAddr)
	_, ep, _ := net.SplitHostPort(e.evilAddr)
	_, tp, _ := net.SplitHostPort(e.tlsSrv.Listener.Addr().String())
	hostIP := "192.0.2.1"
	if len(e.hostIPs) > 0 {
		hostIP = e.hostIPs[0]
	}
	return strings.NewReplacer("{HTTP}", e.httpAddr, "{HH}", hh, "{HP}", hp, "{EVIL}", e.evilAddr, "{EP}", ep,
		"{TP}", tp, "{HOSTIP}", hostIP, "{HOSTIP6}", bracket(hostIP), "{HPX}", portEscape(hp), "{EPX}", portEscape(ep)).Replace(s)
}

// portEscape is a port as the two bytes of a SOCKS5 request, in printf
// escapes.
func portEscape(port string) string {
	n, _ := strconv.Atoi(port)
	return fmt.Sprintf(`\x%02x\x%02x`, n>>8, n&0xff)
}

func bracket(ip string) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]"
	}
	return ip
}

const denied = "X-Pulse-Egress: denied"

var attacks = []attack{
	{"allowed host via CONNECT works", expect(
		`send 'CONNECT {HTTP} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: {HTTP}\r\nConnection: close\r\n\r\n'`,
		[]string{"200 Connection established", "pulse-bypass-ok"})},
	{"allowed host via plain HTTP works", expect(
		`send 'GET http://{HTTP}/ HTTP/1.1\r\nHost: {HTTP}\r\nConnection: close\r\n\r\n'`,
		[]string{"pulse-bypass-ok"})},
	{"allowed name via the proxy variables works (curl)", func(ctx context.Context, e *env) Result {
		return e.withCurl(ctx, `curl -sS --max-time 10 http://allowed.test:{HP}/`, "pulse-bypass-ok")
	}},
	{"allowed address via SOCKS5 works", expect(
		`socks '\x05\x01\x00\x01\x7f\x00\x00\x01{HPX}' 'GET / HTTP/1.1\r\nHost: {HTTP}\r\nConnection: close\r\n\r\n'`,
		[]string{"SOCKS 05 00 05 00", "pulse-bypass-ok"})},
	{"allowed name via SOCKS5 works (the proxy resolves it)", expect(
		`socks '\x05\x01\x00\x03\x0callowed.test{HPX}' 'GET / HTTP/1.1\r\nHost: allowed.test:{HP}\r\nConnection: close\r\n\r\n'`,
		[]string{"SOCKS 05 00 05 00", "pulse-bypass-ok"})},
	{"unlisted host via SOCKS5 is refused", expect(
		`socks '\x05\x01\x00\x01\x7f\x00\x00\x01{EPX}' 'GET / HTTP/1.1\r\n\r\n'`,
		[]string{"SOCKS 05 00 05 02"}, "pulse-bypass-evil")},
	{"a listed name resolving to a denied address via SOCKS5 is refused", expect(
		`socks '\x05\x01\x00\x03\x0brebind.test{HPX}' ''`, []string{"SOCKS 05 00 05 02"})},
	{"SOCKS5 UDP ASSOCIATE and BIND are refused", expect(
		`socks '\x05\x03\x00\x01\x7f\x00\x00\x01{HPX}' ''; socks '\x05\x02\x00\x01\x7f\x00\x00\x01{HPX}' ''`,
		[]string{"SOCKS 05 00 05 07"}, "SOCKS 05 00 05 00")},
	{"a relayed request inside a SOCKS5 tunnel is cut", expect(
		`socks '\x05\x01\x00\x01\x7f\x00\x00\x01{HPX}' 'CONNECT {EVIL} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n'`,
		[]string{"SOCKS 05 00 05 00"}, "pulse-bypass-evil", "pulse-bypass-ok")},
	{"allowed name via SOCKS5 works (curl --socks5-hostname)", func(ctx context.Context, e *env) Result {
		return e.withCurl(ctx, `curl -sS --max-time 10 --proxy "socks5h://${HTTP_PROXY#http://}" http://allowed.test:{HP}/`, "pulse-bypass-ok")
	}},
	{"unlisted host via CONNECT is refused", expect(
		`send 'CONNECT {EVIL} HTTP/1.1\r\n\r\n'`, []string{"403", denied, "retrying will not help"}, "pulse-bypass-evil")},
	{"unlisted name via CONNECT is refused", expect(
		`send 'CONNECT evil.test:443 HTTP/1.1\r\n\r\n'`, []string{"403", denied})},
	{"plain HTTP: allowed Host header, denied URI is refused", expect(
		`send 'GET http://{EVIL}/ HTTP/1.1\r\nHost: {HTTP}\r\nConnection: close\r\n\r\n'`, []string{"403", denied}, "pulse-bypass")},
	{"plain HTTP: allowed URI, denied Host header is refused", expect(
		`send 'GET http://{HTTP}/ HTTP/1.1\r\nHost: {EVIL}\r\nConnection: close\r\n\r\n'`, []string{"403", denied}, "pulse-bypass")},
	{"relayed CONNECT inside an allowed tunnel goes nowhere", expect(
		`send 'CONNECT {HTTP} HTTP/1.1\r\n\r\nCONNECT {EVIL} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n'`,
		[]string{"200 Connection established"}, "pulse-bypass-evil", "pulse-bypass-ok")},
	{"a plain request in an allowed tunnel naming another host is cut", expect(
		`send 'CONNECT {HTTP} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n'`,
		[]string{"200 Connection established"}, "pulse-bypass-ok")},
	{"TLS SNI differing from the CONNECT host is refused", func(ctx context.Context, e *env) Result {
		hello, err := clientHello("evil.test")
		if err != nil {
			return Result{Detail: err.Error()}
		}
		r := expect(`px; { printf 'CONNECT allowed.test:{HP} HTTP/1.1\r\n\r\n'; sleep 0.3; printf '`+hello+`'; } >&3; timeout 10 cat <&3 > /tmp/sni.out; `+
			`head -n1 /tmp/sni.out; grep -q -e 'HTTP/1.1 400' -e pulse-bypass /tmp/sni.out && echo SERVER-ANSWERED; echo done`,
			[]string{"200 Connection established", "done"}, "SERVER-ANSWERED")(ctx, e)
		if r.Held && !e.refusedWith("server name") {
			return Result{Detail: "the proxy did not report refusing the server name"}
		}
		return r
	}},
	{"direct TCP without the proxy fails", expect(
		`for a in {HOSTIP}/{HP} 127.0.0.1/{HP} {HOSTIP}/22; do (exec 3<>/dev/tcp/${a%/*}/${a#*/}) 2>/dev/null && echo "REACHED $a"; done; echo done`,
		[]string{"done"}, "REACHED")},
	{"UDP, DNS on any port and QUIC fail", expect(
		`for a in {HOSTIP}/53 {HOSTIP}/5353 {HOSTIP}/443 {HOSTIP}/8053; do (echo x > /dev/udp/${a%/*}/${a#*/}) 2>/dev/null && echo "SENT $a"; done; echo done`,
		[]string{"done"}, "SENT")},
	{"IPv6 literal not listed is refused", expect(
		`send 'CONNECT [::1]:{HP} HTTP/1.1\r\n\r\n'; (exec 3<>/dev/tcp/::1/{HP}) 2>/dev/null && echo REACHED; echo done`,
		[]string{"403", denied, "done"}, "REACHED")},
	{"127.0.0.1 on an unlisted port is refused", expect(
		`send 'CONNECT 127.0.0.1:{EP} HTTP/1.1\r\n\r\n'`, []string{"403", denied}, "pulse-bypass-evil")},
	{"the host's other addresses are refused", expect(
		`send 'CONNECT {HOSTIP6}:{HP} HTTP/1.1\r\n\r\n'; send 'GET http://{HOSTIP6}:{HP}/ HTTP/1.1\r\nHost: {HOSTIP6}:{HP}\r\n\r\n'`,
		[]string{"403", denied}, "pulse-bypass-ok")},
	{"a listed name resolving to a denied address is refused", expect(
		`send 'CONNECT rebind.test:{HP} HTTP/1.1\r\n\r\n'`, []string{"403", denied, "reached only when listed"})},
	{"an unlisted port of a listed name is refused", expect(
		`send 'CONNECT allowed.test:{EP} HTTP/1.1\r\n\r\n'`, []string{"403", denied})},
	{"the placeholder never leaves for an unbound host", func(ctx context.Context, e *env) Result {
		r := expect(`send "GET http://{HTTP}/ HTTP/1.1\r\nHost: {HTTP}\r\nAuthorization: Bearer $PULSE_BYPASS_TOKEN\r\nConnection: close\r\n\r\n"; `+
			`send "CONNECT {HTTP} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: {HTTP}\r\nAuthorization: Bearer $PULSE_BYPASS_TOKEN\r\n\r\n"`,
			[]string{"403", denied}, "pulse-bypass-unauthorized", "pulse-bypass-authorized")(ctx, e)
		e.seenMu.Lock()
		defer e.seenMu.Unlock()
		for _, h := range e.seen {
			if strings.Contains(h, e.ph) || strings.Contains(h, realSecret) {
				return Result{Detail: "a server received the placeholder or the secret: " + clip(h)}
			}
		}
		return r
	}},
	{"the secret is injected for its bound host (plain HTTP)", expect(
		`send "GET http://bound.test:{HP}/ HTTP/1.1\r\nHost: bound.test:{HP}\r\nAuthorization: Bearer $PULSE_BYPASS_TOKEN\r\nConnection: close\r\n\r\n"`,
		[]string{"pulse-bypass-authorized"}, realSecret)},
	{"the secret is injected for its bound host (TLS, sandbox CA, curl)", func(ctx context.Context, e *env) Result {
		return e.withCurl(ctx, `curl -sS --max-time 10 -H "Authorization: Bearer $PULSE_BYPASS_TOKEN" https://example.com:{TP}/`, "pulse-bypass-authorized")
	}},
	{"a bound host echoing the secret hands back the placeholder (plain HTTP)", expect(
		`send "GET http://bound.test:{HP}/echo HTTP/1.1\r\nHost: bound.test:{HP}\r\nAuthorization: Bearer $PULSE_BYPASS_TOKEN\r\nConnection: close\r\n\r\n"`,
		[]string{"X-Echo: Bearer pulse-placeholder-", "pulse-bypass-echo Bearer pulse-placeholder-"}, realSecret)},
	{"a bound host echoing the secret hands back the placeholder (TLS, curl)", func(ctx context.Context, e *env) Result {
		return e.withCurl(ctx, `curl -sS -i --max-time 10 -H "Authorization: Bearer $PULSE_BYPASS_TOKEN" https://example.com:{TP}/echo | tr -d '\r' | grep -c "Bearer $PULSE_BYPASS_TOKEN"`, "2")
	}},
	{"the sandbox CA is trusted without the variables (curl, system trust store)", func(ctx context.Context, e *env) Result {
		return e.withCurl(ctx, `env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS --max-time 10 -H "Authorization: Bearer $PULSE_BYPASS_TOKEN" https://example.com:{TP}/`, "pulse-bypass-authorized")
	}},
	{"the real secret is nowhere inside the sandbox", func(ctx context.Context, e *env) Result {
		// The script rebuilds the secret from its base64 in a shell
		// variable, so that neither its text nor its environment holds it.
		enc := base64.StdEncoding.EncodeToString([]byte(realSecret))
		script := `s=$(printf %s ` + enc + ` | base64 -d); found=""
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f" 2>/dev/null | grep -qF -- "$s" && found="$found $f"; done
env | grep -qF -- "$s" && found="$found env"
for d in /tmp /run /etc "$HOME" "$PWD"; do grep -rlsF -- "$s" "$d" 2>/dev/null | head -3 | while read -r f; do echo "FOUND-IN $f"; done; done
[ -n "$found" ] && echo "FOUND-IN$found"; echo done`
		out, _, err := e.run(ctx, script)
		if err != nil {
			return Result{Detail: "could not run: " + err.Error()}
		}
		if strings.Contains(out, "FOUND-IN") || !strings.Contains(out, "done") {
			return Result{Detail: clip(out)}
		}
		return Result{Held: true, Detail: "not in the environment, /proc, /tmp, /run, /etc, home or the workspace"}
	}},
}

// withCurl runs a curl command when the sandbox has curl.
func (e *env) withCurl(ctx context.Context, cmd, want string) Result {
	out, _, err := e.run(ctx, `command -v curl >/dev/null || { echo NO-CURL; exit 0; }; `+e.expand(cmd))
	if err != nil {
		return Result{Detail: "could not run: " + err.Error()}
	}
	if strings.Contains(out, "NO-CURL") {
		return Result{Held: true, Skipped: "no curl in the sandbox"}
	}
	if !strings.Contains(out, want) {
		return Result{Detail: clip(out)}
	}
	return Result{Held: true, Detail: firstLine(out)}
}

func (e *env) refusedWith(reason string) bool {
	time.Sleep(100 * time.Millisecond) // the tunnel's event follows its close
	e.evMu.Lock()
	defer e.evMu.Unlock()
	for _, ev := range e.events {
		if !ev.Allowed && strings.Contains(ev.Reason, reason) {
			return true
		}
	}
	return false
}

// clientHello is the first TLS record a Go client sends for sni, as a
// printf format string of \x escapes.
func clientHello(sni string) (string, error) {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
		a.Close()
	}()
	defer b.Close()
	b.SetDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		return "", err
	}
	n := int(hdr[3])<<8 | int(hdr[4])
	rec := make([]byte, 5+n)
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		return "", err
	}
	var s strings.Builder
	for _, c := range rec {
		fmt.Fprintf(&s, "\\x%02x", c)
	}
	return s.String(), nil
}
