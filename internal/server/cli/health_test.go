package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

func getStatus(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestHealthListenerForProbesWithoutClientCertificate is what a kubelet
// sees: the API listener wants a client certificate, which a probe never
// has, so --health-listen serves /readyz over plain HTTP — and nothing
// else: the WebSocket API and /metrics are not reachable there. Tokens
// come from files (PULSE_REMOTE_TOKEN_FILE, PULSE_WORKER_TOKEN_FILE,
// SANDBOX_TOKEN_FILE), as a mounted Kubernetes secret holds them, and a
// real pulse-worker's own /readyz turns ready once it has attached.
func TestHealthListenerForProbesWithoutClientCertificate(t *testing.T) {
	dir := t.TempDir()
	p := testenv.NewPKI(t)
	tokens := filepath.Join(dir, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	// A trailing newline, as `kubectl create secret --from-file` keeps it.
	for name, v := range map[string]string{"remote": "dev-token\n", "worker": "worker-token\n"} {
		if err := os.WriteFile(filepath.Join(tokens, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	health := testenv.FreeAddr(t)
	s := start(t, []string{"--development", "--executor", "relay", "--worker-listen", "127.0.0.1:0", "--port", "0",
		"--health-listen", health,
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN_FILE": filepath.Join(tokens, "remote"), "PULSE_WORKER_TOKEN_FILE": filepath.Join(tokens, "worker"),
			"PULSE_TLS_CERT": p.ServerCertFile, "PULSE_TLS_KEY": p.ServerKeyFile, "PULSE_TLS_CA": p.CAFile})

	plain := &http.Client{Timeout: 10 * time.Second}
	if code, body, err := getStatus(plain, "http://"+health+"/readyz"); err != nil || code != http.StatusOK || !strings.Contains(body, `"ok"`) {
		t.Fatalf("server /readyz on the health listener: %d %q %v", code, body, err)
	}
	for _, path := range []string{"/", "/metrics", "/v1/executions"} {
		if code, _, err := getStatus(plain, "http://"+health+path); err != nil || code != http.StatusNotFound {
			t.Errorf("health listener serves %s: %d %v; want 404", path, code, err)
		}
	}
	// The API listener still refuses a client without a certificate.
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: p.ClientConfig().Clone()}}
	noCert.Transport.(*http.Transport).TLSClientConfig.Certificates = nil
	if _, _, err := getStatus(noCert, "https://"+s.api+"/readyz"); err == nil {
		t.Error("the API listener answered a client without a certificate")
	}

	wHealth := testenv.FreeAddr(t)
	w := testenv.Command(t, "pulse-worker")
	w.Env = append(w.Env, "RELAY_ADDR="+s.workers, "SANDBOX_TOKEN_FILE="+filepath.Join(tokens, "worker"), "RELAY_TLS=1",
		"SANDBOX_ID=probed-worker", "SSL_CERT_FILE="+p.CAFile, "WORKER_HEALTH_LISTEN="+wHealth)
	var wlog testenv.SyncBuffer
	w.Stderr = &wlog
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { w.Process.Kill(); w.Wait() }()
	testenv.Eventually(t, 30*time.Second, func() error {
		code, _, err := getStatus(plain, "http://"+wHealth+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("worker /readyz %d\n%s", code, wlog.String())
		}
		return nil
	})
	// Attached with the token from the file: the relay counts it.
	withCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: p.ClientConfig()}}
	if _, body, err := getStatus(withCert, "https://"+s.api+"/metrics"); err != nil || !strings.Contains(body, "pulse_server_workers 1") {
		t.Fatalf("worker not counted: %v\n%s", err, body)
	}
	if out := roundTrip(t, "wss://"+s.api, "dev-token", withCert); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
}

// TestTokenFileProblems: a token both in the environment and in a file is
// refused, not guessed between, and a missing file is named.
func TestTokenFileProblems(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "tok")
	if err := os.WriteFile(f, []byte("dev-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"PULSE_REMOTE_TOKEN": "dev", "PULSE_REMOTE_TOKEN_FILE": f}, "PULSE_REMOTE_TOKEN and PULSE_REMOTE_TOKEN_FILE are both set"},
		{map[string]string{"PULSE_REMOTE_TOKEN_FILE": filepath.Join(dir, "missing")}, "PULSE_REMOTE_TOKEN_FILE: open"},
		{map[string]string{"PULSE_REMOTE_TOKEN_FILE": f, "PULSE_WORKER_TOKEN": "w", "PULSE_WORKER_TOKEN_FILE": f}, "PULSE_WORKER_TOKEN and PULSE_WORKER_TOKEN_FILE are both set"},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), []string{"--development"}, env(tc.env), &bytes.Buffer{}, &stderr, nil)
		if code != ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.env, code, stderr.String(), tc.want)
		}
	}
	if _, err := secretEnv(env(map[string]string{"X_FILE": f}), "X"); err != nil {
		t.Fatal(err)
	} else if v, _ := secretEnv(env(map[string]string{"X_FILE": f}), "X"); v != "dev-token" {
		t.Errorf("secretEnv = %q, want the file's token without its newline", v)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("a"), maxSecretFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := secretEnv(env(map[string]string{"X_FILE": big}), "X"); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Errorf("an oversized token file: %v", err)
	}
}
