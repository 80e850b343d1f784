package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// With --allow-host and nothing else, a command reaches the listed local
// server through the proxy and nothing else; the refused host is named
// after the command.
func TestExecAllowHost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from-the-local-server") }))
	defer srv.Close()
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	script := `get() { exec 3<>/dev/tcp/127.0.0.1/3128; printf "GET http://$1/ HTTP/1.1\r\nHost: $1\r\nConnection: close\r\n\r\n" >&3; cat <&3; }; get ` +
		srv.Listener.Addr().String() + `; get ` + other.Addr().String()
	code, stdout, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "namespace",
		"--allow-host", srv.Listener.Addr().String(), "--", "bash", "-c", script)
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "from-the-local-server") || !strings.Contains(stdout, "403 Forbidden") {
		t.Errorf("stdout %q", stdout)
	}
	if !strings.Contains(stderr, "network refused: "+other.Addr().String()) {
		t.Errorf("no summary of the refused host:\n%s", stderr)
	}
	if code, _, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--allow-host", "bad host", "--", "true"); code != exitUsage {
		t.Errorf("a malformed --allow-host: exit %d: %s", code, stderr)
	}
}

// `pulse doctor --attack` is `pulse doctor network` as the issue spells it.
func TestDoctorAttackOnNamespace(t *testing.T) {
	code, stdout, stderr := runCLI(t, "doctor", "--attack", "--backend", "namespace", "--json")
	var report []struct {
		Backend string
		Reason  string
		Results []struct {
			Name    string
			Held    bool
			Detail  string
			Skipped string
		}
	}
	if err := json.Unmarshal([]byte(stdout), &report); err != nil || len(report) != 1 {
		t.Fatalf("exit %d, report %q (%v): %s", code, stdout, err, stderr)
	}
	if report[0].Reason != "" {
		testenv.Missing(t, testenv.Namespace, "namespace not tried: "+report[0].Reason)
	}
	if code != 0 || len(report[0].Results) < 15 {
		t.Fatalf("exit %d, %d results: %s", code, len(report[0].Results), stdout)
	}
	for _, r := range report[0].Results {
		if !r.Held {
			t.Errorf("%s: %s", r.Name, r.Detail)
		}
		if r.Skipped != "" && testenv.Required(testenv.Namespace) {
			t.Errorf("%s skipped: %s", r.Name, r.Skipped)
		}
	}
}

// TestExecNamesTheRealReasonOfACutTunnel: the proxy cuts a tunnel to an
// allowed host when a request inside it names another host. The summary
// must not list that allowed host as "not in the allowlist" with an
// --allow-host hint; it says the connection was cut, and why, as the
// audit log has it.
func TestExecNamesTheRealReasonOfACutTunnel(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) }))
	defer srv.Close()
	allowed := srv.Listener.Addr().String()
	script := `exec 3<>/dev/tcp/127.0.0.1/3128; printf "CONNECT ` + allowed + ` HTTP/1.1\r\nHost: ` + allowed +
		`\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n" >&3; cat <&3`
	ws := t.TempDir()
	code, stdout, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "namespace",
		"--allow-host", allowed, "--", "bash", "-c", script)
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 || strings.Contains(stdout, "hello evil.test") {
		t.Fatalf("exit %d, stdout %q: %s", code, stdout, stderr)
	}
	audit, err := os.ReadFile(filepath.Join(ws, ".pulse", "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	reason := ""
	for _, line := range strings.Split(string(audit), "\n") {
		var e struct{ Action, Decision, Destination, Reason string }
		if json.Unmarshal([]byte(line), &e) == nil && e.Action == "network" && e.Decision == "deny" && e.Destination == "127.0.0.1" {
			reason = e.Reason
		}
	}
	if reason == "" || !strings.Contains(reason, "evil.test") {
		t.Fatalf("the audit log has no refusal naming evil.test:\n%s", audit)
	}
	if strings.Contains(stderr, "not in the allowlist") || strings.Contains(stderr, "network refused: "+allowed) {
		t.Fatalf("the allowed host is listed as not in the allowlist:\n%s", stderr)
	}
	if !strings.Contains(stderr, "network cut: "+allowed) || !strings.Contains(stderr, reason) {
		t.Fatalf("the summary does not give the audit log's reason %q:\n%s", reason, stderr)
	}

	code, stdout, _ = runCLI(t, "exec", "--workspace", ws, "--backend", "namespace", "--json",
		"--allow-host", allowed, "--", "bash", "-c", script)
	var res struct {
		Refusals []struct {
			Destination, Reason string
			Cut                 bool
		} `json:"network_refusals"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || code != 0 || len(res.Refusals) != 1 ||
		res.Refusals[0].Destination != allowed || !res.Refusals[0].Cut || res.Refusals[0].Reason != reason {
		t.Fatalf("--json: exit %d, %+v (%v)\n%s", code, res.Refusals, err, stdout)
	}
}
