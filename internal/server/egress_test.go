package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
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
