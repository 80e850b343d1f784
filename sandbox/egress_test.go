package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/policy"
)

type fixedResolver map[string]string

func (f fixedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// End to end on the namespace backend: with the default policy and only
// WithAllowHosts, a command reaches the listed local server and nothing
// else; the secret bound to that server's name reaches it as a header
// while the command only ever holds a placeholder; every connection is in
// the audit log, and the refused one is in the result.
func TestEgressAllowlistAndInjectionEndToEnd(t *testing.T) {
	const token = "tok_e2e_0123456789abcdefghij"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+token {
			io.WriteString(w, "authorized\n")
			return
		}
		io.WriteString(w, "hello\n")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	evil, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()

	ws := t.TempDir()
	sb := newIsolated(t, ws,
		WithAllowHosts("127.0.0.1:"+port, "api.local.test:"+port),
		WithInjectedSecret("API_TOKEN", token, "api.local.test"),
		WithEgressResolver(fixedResolver{"api.local.test": "127.0.0.1"}))
	script := fmt.Sprintf(`echo "token is $API_TOKEN"
get() { exec 3<>/dev/tcp/127.0.0.1/3128; printf "GET http://$1/ HTTP/1.1\r\nHost: $1\r\nAuthorization: Bearer $API_TOKEN\r\nConnection: close\r\n\r\n" >&3; cat <&3; exec 3<&-; }
get api.local.test:%s
exec 3<>/dev/tcp/127.0.0.1/3128; printf "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" >&3; cat <&3; exec 3<&-
exec 3<>/dev/tcp/127.0.0.1/3128; printf "CONNECT %s HTTP/1.1\r\n\r\n" >&3; cat <&3
`, port, srv.Listener.Addr(), srv.Listener.Addr(), evil.Addr())
	res, err := sb.Execute(context.Background(), Command{Shell: script})
	if err != nil {
		t.Fatal(err)
	}
	out := res.Stdout + res.Stderr
	if !strings.Contains(out, "token is pulse-placeholder-API_TOKEN-") {
		t.Errorf("the command did not hold the placeholder: %q", out)
	}
	if !strings.Contains(out, "authorized") || !strings.Contains(out, "hello") {
		t.Errorf("the allowed requests failed: %q", out)
	}
	if !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "retrying will not help") {
		t.Errorf("the refused CONNECT was not explained: %q", out)
	}
	if want := evil.Addr().String(); !slices.Contains(res.NetworkRefused, want) {
		t.Errorf("NetworkRefused = %v, want %s", res.NetworkRefused, want)
	}
	if len(res.NetworkRefusals) != len(res.NetworkRefused) || !slices.ContainsFunc(res.NetworkRefusals, func(r NetworkRefusal) bool {
		return r.Destination == evil.Addr().String() && !r.Cut && r.Reason != ""
	}) {
		t.Errorf("NetworkRefusals = %+v, want %s refused as a destination, with its reason", res.NetworkRefusals, evil.Addr())
	}

	events := verifyAudit(t, sb)
	var allowed, denied, injected int
	for _, e := range events {
		if e.Action != "network" || e.Destination == "*" {
			continue
		}
		switch {
		case e.Decision == "deny" && e.Port != 0:
			denied++
		case e.Decision == "allow" && strings.Contains(e.Detail, "injected API_TOKEN"):
			injected++
			allowed++
		case e.Decision == "allow":
			allowed++
		}
	}
	if allowed != 2 || denied != 1 || injected != 1 {
		t.Errorf("network events: %d allowed (%d injected), %d denied; want 2 (1), 1", allowed, injected, denied)
	}
	data, err := os.ReadFile(sb.AuditPath())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), token) {
		t.Error("the audit log holds the real token")
	}
}

// Without WithAllowHosts, and with the policy denying the network, an
// allowlist in WithNetworkPolicy is not applied: deny-all stays.
// The caller hears why, in the log and in the reason Diagnose gives.
func TestAllowlistNeedsNetworkAllowedOrAllowHosts(t *testing.T) {
	var logs syncio.Buffer
	sb := newIsolated(t, t.TempDir(), WithNetworkPolicy(networkAllowlist("127.0.0.1:1")),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	np, _ := sb.effectivePolicies()
	if np.Mode != "deny-all" {
		t.Errorf("mode %s", np.Mode)
	}
	if !strings.Contains(logs.String(), "network policy not applied") || !strings.Contains(logs.String(), "defaults.network: deny") {
		t.Errorf("no warning that the allowlist is not applied:\n%s", logs.String())
	}
	if _, why := sb.effectiveNetwork(); !strings.Contains(why, "asks for allowlist, but the policy does not allow the network action (defaults.network: deny)") {
		t.Errorf("why = %q", why)
	}
}

func networkAllowlist(entries ...string) policy.NetworkPolicy {
	return policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: entries}
}

// Through a real pulse-server (namespace executor): the secret bound to a
// host is injected by the server's proxy, the command holds only the
// placeholder, the placeholder headed elsewhere is refused, and every
// connection the server's proxy saw is in this side's audit log.
func TestRemoteEgressInjectionEndToEnd(t *testing.T) {
	const token = "tok_remote_e2e_0123456789abcdef"
	var seen []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") == "Bearer "+token {
			io.WriteString(w, "authorized\n")
			return
		}
		io.WriteString(w, "hello\n")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	sb := newRemoteNamespace(t, WithAllowHosts("localhost:"+port, "127.0.0.1:"+port),
		WithInjectedSecret("API_TOKEN", token, "localhost"))
	script := fmt.Sprintf(`echo "token is $API_TOKEN"
p=${HTTP_PROXY#http://}; p=${p%%/}
get() { exec 3<>/dev/tcp/${p%%:*}/${p##*:}; printf "GET http://$1/ HTTP/1.1\r\nHost: $1\r\nAuthorization: Bearer $API_TOKEN\r\nConnection: close\r\n\r\n" >&3; cat <&3; exec 3<&-; }
get localhost:%s
get 127.0.0.1:%s
`, port, port)
	res, err := sb.Execute(context.Background(), Command{Shell: script})
	if err != nil {
		t.Fatal(err)
	}
	out := res.Stdout + res.Stderr
	if !strings.Contains(out, "token is pulse-placeholder-API_TOKEN-") || strings.Contains(out, token) {
		t.Errorf("the command did not hold the placeholder only: %q", out)
	}
	if !strings.Contains(out, "authorized") {
		t.Errorf("the secret was not injected for its host: %q", out)
	}
	if !strings.Contains(out, "403 Forbidden") {
		t.Errorf("the placeholder to an unbound host was not refused: %q", out)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "Bearer "+token {
		t.Errorf("the server saw Authorization %q; want the real token once", seen)
	}
	mu.Unlock()
	var allowed, denied int
	for _, e := range verifyAudit(t, sb) {
		if e.Action != "network" || e.Destination == "*" {
			continue
		}
		switch {
		case e.Decision == "allow" && e.Destination == "localhost" && strings.Contains(e.Detail, "injected API_TOKEN"):
			allowed++
		case e.Decision == "deny" && e.Destination == "127.0.0.1":
			denied++
		}
	}
	if allowed != 1 || denied != 1 {
		t.Errorf("audit: %d injected allowed, %d denied network events; want 1, 1", allowed, denied)
	}
	if want := "127.0.0.1:" + port; !slices.Contains(res.NetworkRefused, want) {
		t.Errorf("NetworkRefused = %v, want %s", res.NetworkRefused, want)
	}
	data, err := os.ReadFile(sb.AuditPath())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), token) {
		t.Error("the audit log holds the real token")
	}
}

// Through a real pulse-server, a command that first makes many allowed
// requests (more than a result's network list holds) and then tries an
// unlisted destination still has that refusal in this side's audit log
// and in NetworkRefused: the server's report keeps refusals before
// allowed connections, and what it leaves out is audited as such.
func TestRemoteEgressRefusalAfterAFloodIsAudited(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	sb := newRemoteNamespace(t, WithAllowHosts("127.0.0.1:"+port))
	// 1100 pipelined requests on one connection (one network event each),
	// then one to a port not on the list.
	script := fmt.Sprintf(`p=${HTTP_PROXY#http://}; p=${p%%/}
exec 3<>/dev/tcp/${p%%:*}/${p##*:}
req="GET http://127.0.0.1:%[1]s/ HTTP/1.1\r\nHost: 127.0.0.1:%[1]s\r\n\r\n"
all=""; for i in $(seq 1099); do all="$all$req"; done
printf "${all}GET http://127.0.0.1:%[1]s/ HTTP/1.1\r\nHost: 127.0.0.1:%[1]s\r\nConnection: close\r\n\r\n" >&3
echo "answers: $(grep -c '^ok' <&3)"; exec 3<&-
exec 3<>/dev/tcp/${p%%:*}/${p##*:}
printf "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: close\r\n\r\n" >&3
head -n1 <&3; exec 3<&-
`, port)
	res, err := sb.Execute(context.Background(), Command{Shell: script})
	if err != nil {
		t.Fatal(err)
	}
	out := res.Stdout + res.Stderr
	if !strings.Contains(out, "answers: 1100") || !strings.Contains(out, "403 Forbidden") {
		t.Fatalf("the command did not make its requests: %q", out)
	}
	var allowed, denied, gap int
	for _, e := range verifyAudit(t, sb) {
		if e.Action != "network" {
			continue
		}
		switch {
		case e.Decision == "allow":
			allowed++
		case e.Decision == "deny" && e.Destination == "127.0.0.1" && e.Port == 1:
			denied++
		case e.Reason == "not_reported" && strings.HasPrefix(e.Detail, "101 more connections"):
			gap++
		}
	}
	if denied != 1 {
		t.Errorf("audit: %d refusals of 127.0.0.1:1 (after %d allowed connections); want 1", denied, allowed)
	}
	if gap != 1 {
		t.Errorf("audit: %d events saying that 101 connections were not reported; want 1", gap)
	}
	if !slices.Contains(res.NetworkRefused, "127.0.0.1:1") {
		t.Errorf("NetworkRefused = %v, want 127.0.0.1:1", res.NetworkRefused)
	}
}
