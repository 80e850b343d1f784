package worker

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/worker/runner"
)

func TestFromEnvDefaultsAndOverrides(t *testing.T) {
	c, err := FromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.RelayAddr != "localhost:8443" || c.SandboxID != "sbx-laptop-1" || c.Token != "dev-token" ||
		c.TLS || c.MaxConcurrent != 4 || c.Image != "" || c.Trust != "untrusted" {
		t.Errorf("defaults = %+v", c)
	}
	env := map[string]string{
		EnvRelayAddr: "relay:9", EnvSandboxID: "sbx-2", EnvToken: "t", EnvTLS: "1",
		EnvMaxConcurrent: "8", EnvImage: "img", EnvTrust: "trusted",
	}
	c, err = FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.RelayAddr != "relay:9" || c.SandboxID != "sbx-2" || c.Token != "t" || !c.TLS ||
		c.MaxConcurrent != 8 || c.Image != "img" || c.Trust != "trusted" {
		t.Errorf("from env = %+v", c)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.BindFlags(fs)
	if err := fs.Parse([]string{"-max-concurrent", "2", "-tls=false", "-relay-addr", "other:1"}); err != nil {
		t.Fatal(err)
	}
	if c.MaxConcurrent != 2 || c.TLS || c.RelayAddr != "other:1" || c.SandboxID != "sbx-2" {
		t.Errorf("flags did not override: %+v", c)
	}
}

func TestFromEnvRejectsGarbage(t *testing.T) {
	for k, v := range map[string]string{EnvTLS: "perhaps", EnvMaxConcurrent: "four"} {
		_, err := FromEnv(func(name string) string {
			if name == k {
				return v
			}
			return ""
		})
		if !errors.Is(err, ErrConfig) {
			t.Errorf("%s=%q: err = %v, want ErrConfig", k, v, err)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.RelayAddr = "" },
		func(c *Config) { c.SandboxID = "" },
		func(c *Config) { c.MaxConcurrent = 0 },
		func(c *Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond },
	}
	for i, mut := range bad {
		c := Default()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("case %d: err = %v, want ErrConfig", i, err)
		}
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
}

// WORKER_ISOLATION is read as given and checked by Validate: a value no
// worker knows is a configuration error, not a silent auto.
func TestIsolationConfig(t *testing.T) {
	c, err := FromEnv(func(k string) string {
		if k == EnvIsolation {
			return "gvisor"
		}
		return ""
	})
	if err != nil || c.Isolation != runner.IsolationGVisor {
		t.Fatalf("FromEnv: %q %v, want gvisor", c.Isolation, err)
	}
	if d := Default(); d.Isolation != runner.IsolationAuto {
		t.Errorf("default isolation %q, want auto", d.Isolation)
	}
	for _, v := range []string{"", "auto", "namespace", "gvisor"} {
		c := Default()
		c.Isolation = v
		if err := c.Validate(); err != nil {
			t.Errorf("isolation %q refused: %v", v, err)
		}
	}
	c = Default()
	c.Isolation = "docker"
	if err := c.Validate(); !errors.Is(err, ErrConfig) {
		t.Errorf("isolation docker: %v, want ErrConfig", err)
	}
}

func TestDetectCapabilities(t *testing.T) {
	fake := func(name string) (string, error) {
		if name == "bash" || name == "git" {
			return "/bin/" + name, nil
		}
		return "", exec.ErrNotFound
	}
	if got := DetectCapabilities(fake); !slices.Equal(got, []string{"bash", "git"}) {
		t.Errorf("got %v", got)
	}
}

func TestChildEnvDropsToken(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "SANDBOX_TOKEN=s", "SANDBOX_TOKEN_FILE=/run/secrets/t", "SANDBOX_TOKENISH=keep"})
	if !slices.Equal(got, []string{"PATH=/bin", "SANDBOX_TOKENISH=keep"}) {
		t.Errorf("got %v", got)
	}
}

func TestBackoffDoublesToCapWithJitter(t *testing.T) {
	b := backoff{min: 500 * time.Millisecond, max: 30 * time.Second}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, d := range want {
		got := b.next()
		if got < d/2 || got > d {
			t.Errorf("step %d: wait %v outside [%v, %v]", i, got, d/2, d)
		}
	}
	b.reset()
	if got := b.next(); got > 500*time.Millisecond {
		t.Errorf("after reset: %v", got)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"localhost:1": true, "127.0.0.1:1": true, "[::1]:1": true, "relay.example:443": false, "10.0.0.1:1": false} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v", addr, got)
		}
	}
}

// TestTokenFile: SANDBOX_TOKEN_FILE gives the token without its trailing
// newline; with SANDBOX_TOKEN also set, or a file that is empty or
// missing, the configuration is refused.
func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	good, empty := filepath.Join(dir, "tok"), filepath.Join(dir, "empty")
	os.WriteFile(good, []byte("s3cret\n"), 0o600)
	os.WriteFile(empty, []byte("\n"), 0o600)
	c, err := FromEnv(func(k string) string { return map[string]string{EnvTokenFile: good}[k] })
	if err != nil || c.Token != "s3cret" {
		t.Fatalf("token %q, err %v", c.Token, err)
	}
	for _, env := range []map[string]string{
		{EnvTokenFile: good, EnvToken: "other"},
		{EnvTokenFile: empty},
		{EnvTokenFile: filepath.Join(dir, "missing")},
	} {
		if _, err := FromEnv(func(k string) string { return env[k] }); !errors.Is(err, ErrConfig) {
			t.Errorf("%v: err = %v, want ErrConfig", env, err)
		}
	}
}
