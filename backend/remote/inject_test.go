package remote

import (
	"errors"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// Secrets bound to hosts go to the server only for an allowlist command,
// only to a server that injects, and only over wss:// or to loopback.
func TestWireInjectSendsSecretsOnlyWhereSafe(t *testing.T) {
	req := &backend.Request{Egress: &backend.Egress{Inject: []backend.Injection{
		{Name: "TOKEN", Placeholder: "pulse-placeholder-TOKEN-0123456789abcdef", Value: "v", Hosts: []string{"api.example.com"}}}}}
	allowlist := policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"api.example.com"}}
	injects := map[string]bool{protocol.FeatureInject: true}
	newB := func(url string) *Backend {
		b, err := New(WithURL(url), WithToken("wire-inject-test-token"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	local := newB("ws://127.0.0.1:1/")
	got, err := local.wireInject(req, allowlist, injects)
	if err != nil || len(got) != 1 || got[0].Value != "v" || got[0].Env != "TOKEN" {
		t.Fatalf("loopback: %+v %v", got, err)
	}
	if got, err := local.wireInject(req, policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, injects); err != nil || got != nil {
		t.Errorf("allow-all: %+v %v; want nothing sent", got, err)
	}
	if _, err := local.wireInject(req, allowlist, map[string]bool{}); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("server without the feature: %v", err)
	}
	if _, err := newB("ws://192.0.2.1:1/").wireInject(req, allowlist, injects); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("clear text to another machine: %v", err)
	}
}
