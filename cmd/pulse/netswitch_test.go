package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// A policy file whose network section is an allowlist lets a command
// reach the listed host through the proxy with no second switch
// (defaults.network), on namespace.
func TestExecAllowlistPolicyAloneLetsCommandsOut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from-the-local-server") }))
	defer srv.Close()
	pol := filepath.Join(t.TempDir(), "p.yaml")
	must(t, os.WriteFile(pol, fmt.Appendf(nil, "network:\n  mode: allowlist\n  allow: [%q]\n", srv.Listener.Addr().String()), 0o644))
	script := `exec 3<>/dev/tcp/127.0.0.1/3128; printf "GET http://$1/ HTTP/1.1\r\nHost: $1\r\nConnection: close\r\n\r\n" >&3; cat <&3`
	code, stdout, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "namespace", "--policy", pol,
		"--", "bash", "-c", script, "get", srv.Listener.Addr().String())
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != 0 || !strings.Contains(stdout, "from-the-local-server") {
		t.Fatalf("exit %d, stdout %q: %s", code, stdout, stderr)
	}
}

// `pulse doctor` says why the network is what it is, and what to add when
// commands get none.
func TestDoctorSaysWhyTheNetworkIs(t *testing.T) {
	tests := []struct {
		name, policy string // "" for the built-in policy
		mode, why    string
	}{
		{"built-in policy", "", "deny-all", "the policy does not allow the network action (defaults.network: deny); a policy file's `network: {mode: allowlist, allow: [HOST]}`"},
		{"allowlist alone", "network: {mode: allowlist, allow: [proxy.golang.org]}\n", "allowlist", "the policy's network section allows proxy.golang.org, through the egress proxy"},
		{"network allowed, no section", "defaults: {network: allow}\n", "deny-all", "no network policy is set; add `network: {mode: allowlist"},
		{"deny-all section", "network: {mode: deny-all}\n", "deny-all", "does not allow the network action"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"doctor", "--json"}
			if tt.policy != "" {
				pol := filepath.Join(t.TempDir(), "p.yaml")
				must(t, os.WriteFile(pol, []byte(tt.policy), 0o644))
				args = append(args, "--policy", pol)
			}
			code, stdout, stderr := runCLI(t, args...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var report []struct {
				Name   string `json:"name"`
				Policy *struct {
					Network    string `json:"network"`
					NetworkWhy string `json:"network_why"`
				} `json:"policy"`
			}
			must(t, json.Unmarshal([]byte(stdout), &report))
			seen := 0
			for _, st := range report {
				if st.Policy == nil || st.Name == "host" {
					continue // host: the unsafe backend, not selectable here
				}
				seen++
				if st.Policy.Network != tt.mode || !strings.Contains(st.Policy.NetworkWhy, tt.why) {
					t.Errorf("%s: network %s because %q; want %s because ...%q...", st.Name, st.Policy.Network, st.Policy.NetworkWhy, tt.mode, tt.why)
				}
			}
			if seen == 0 {
				t.Fatalf("no backend reported the policy: %s", stdout)
			}
		})
	}
	// The text report says it too.
	code, stdout, _ := runCLI(t, "doctor")
	if code != exitOK || !strings.Contains(stdout, "because the policy does not allow the network action") {
		t.Errorf("text report does not say why the network is denied:\n%s", stdout)
	}
}
