package server

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// An allowlist submission gets a proxy of its own on a unix socket: the
// listed local server is reachable through it, nothing else, and the
// proxy is gone when the execution is.
func TestLocalAllowlistGetsAnEgressProxy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") }))
	defer srv.Close()
	req := &backend.Request{ExecutionID: "e1", Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist,
		Allow: []string{srv.Listener.Addr().String()}}}
	r, stop, err := withEgress(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Egress == nil || req.Egress != nil {
		t.Fatal("the request was not given its own egress")
	}
	get := func(target string) string {
		c, err := net.Dial("unix", r.Egress.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b)
	}
	if got := get(srv.Listener.Addr().String()); !strings.Contains(got, "reached") {
		t.Errorf("allowed: %q", got)
	}
	if got := get("127.0.0.1:1"); !strings.HasPrefix(got, "403") {
		t.Errorf("unlisted: %q", got)
	}
	stop()
	if _, err := os.Stat(r.Egress.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	// Other modes pass through untouched.
	dr := &backend.Request{Network: policy.DenyAllNetwork()}
	if got, stop, err := withEgress(dr, nil); err != nil || got != dr {
		t.Errorf("deny-all changed: %v", err)
	} else {
		stop()
	}
}

// A client's secret bound to a host is put into requests to that host by
// the execution's proxy, which has a CA of its own for TLS; the value is
// in no log line, and the connection comes back from stop.
func TestLocalEgressInjectsAndReportsConnections(t *testing.T) {
	const value = "v4lue-of-the-secret-0123456789"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+value {
			io.WriteString(w, "authorized")
			return
		}
		io.WriteString(w, "anonymous")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ph := egress.NewPlaceholder("TOKEN")
	var logs syncio.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	req := &backend.Request{ExecutionID: "e2", Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist,
		Allow: []string{"localhost:" + port}},
		Egress: &backend.Egress{Inject: []backend.Injection{{Name: "TOKEN", Placeholder: ph, Value: value, Hosts: []string{"localhost"}}}}}
	r, stop, err := withEgress(req, log)
	if err != nil {
		t.Fatal(err)
	}
	if r.Egress.Socket == "" || r.Egress.CAFile == "" || len(r.Egress.CA) == 0 {
		t.Fatalf("egress %+v: no socket or CA", r.Egress)
	}
	c, err := net.Dial("unix", r.Egress.Socket)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET http://localhost:%s/ HTTP/1.1\r\nHost: localhost:%s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", port, port, ph)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	c.Close()
	if string(b) != "authorized" {
		t.Errorf("answer %q", b)
	}
	evs, dropped := stop()
	if len(evs) != 1 || dropped != 0 || !evs[0].Allowed || evs[0].Host != "localhost" || len(evs[0].Injected) != 1 || evs[0].Injected[0] != "TOKEN" {
		t.Errorf("events %+v, %d dropped", evs, dropped)
	}
	if strings.Contains(logs.String(), value) || !strings.Contains(logs.String(), "TOKEN") {
		t.Errorf("log: %s", logs.String())
	}
}

// A result's network list is bounded; once it is full, a refusal takes
// the place of an allowed connection, so that allowed requests made first
// cannot push a refusal out of the report. What is left out is counted.
func TestEgressReportKeepsRefusals(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	req := &backend.Request{ExecutionID: "e3", Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{addr}}}
	r, stop, err := withEgress(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	exchange := func(target string, n int) {
		c, err := net.Dial("unix", r.Egress.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var b strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		}
		fmt.Fprintf(&b, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, target)
		go io.WriteString(c, b.String())
		io.Copy(io.Discard, c)
	}
	extra := 5
	exchange(addr, protocol.MaxNetworkEvents+extra-1) // one connection, one event per request
	for i := 0; i < 3; i++ {
		exchange(fmt.Sprintf("127.0.0.1:%d", i+1), 0)
	}
	evs, dropped := stop()
	var refused []string
	for _, e := range evs {
		if !e.Allowed {
			refused = append(refused, fmt.Sprintf("%s:%d", e.Host, e.Port))
		}
	}
	if len(evs) != protocol.MaxNetworkEvents || dropped != extra+3 || len(refused) != 3 {
		t.Errorf("%d events, %d dropped, refusals %v; want %d, %d and the 3 refusals", len(evs), dropped, refused, protocol.MaxNetworkEvents, extra+3)
	}
}
