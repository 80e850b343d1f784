package protocol

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

func TestCapabilitiesHeaderRoundTrip(t *testing.T) {
	caps := backend.Capabilities{Isolation: backend.IsolationNamespace,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{policy.NetworkDenyAll: policy.Strong}}
	v, err := CapabilitiesHeader(map[string]any{"status": StatusCapabilities, "executor": "local:namespace",
		"capabilities": caps, "features": []string{FeatureStdin, FeatureWorkspace}, "max_stdin_bytes": 7})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseCapabilitiesHeader(v)
	if err != nil {
		t.Fatal(err)
	}
	if r.Executor != "local:namespace" || r.MaxStdinBytes != 7 || len(r.Features) != 2 || r.Features[1] != FeatureWorkspace ||
		r.Capabilities.Isolation != backend.IsolationNamespace || r.Capabilities.Network[policy.NetworkDenyAll] != policy.Strong {
		t.Fatalf("decoded %+v (caps %+v)", r, r.Capabilities)
	}
}

// A value that is not a capabilities answer is refused as a bad frame;
// the client then asks with the action.
func TestCapabilitiesHeaderRefusals(t *testing.T) {
	enc := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for name, v := range map[string]string{
		"not base64":       "{not base64}",
		"unpadded":         strings.TrimRight(enc(`{"status":"CAPABILITIES","capabilities":{}}`), "="),
		"empty":            enc(""),
		"array":            enc(`[1]`),
		"bad json":         enc(`{"status":`),
		"other status":     enc(`{"status":"STARTING","capabilities":{}}`),
		"no capabilities":  enc(`{"status":"CAPABILITIES"}`),
		"null capabilites": enc(`{"status":"CAPABILITIES","capabilities":null}`),
		"too long":         enc(`{"status":"CAPABILITIES","capabilities":{},"x":"` + strings.Repeat("a", MaxCapabilitiesHeader) + `"}`),
	} {
		if r, err := ParseCapabilitiesHeader(v); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %+v, %v; want ErrFrame", name, r, err)
		}
	}
}

func FuzzParseCapabilitiesHeader(f *testing.F) {
	good, _ := CapabilitiesHeader(map[string]any{"status": StatusCapabilities, "capabilities": map[string]any{"isolation": "host_unsafe"}})
	f.Add(good)
	f.Add("")
	f.Add("e30=")
	f.Fuzz(func(t *testing.T, v string) {
		r, err := ParseCapabilitiesHeader(v)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v does not wrap ErrFrame", err)
			}
			return
		}
		if r.Status != StatusCapabilities || r.Capabilities == nil {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// An answer a reverse proxy might not pass in a header is not put there:
// the client then asks with the action.
func TestCapabilitiesHeaderBoundedForProxies(t *testing.T) {
	big := map[string]any{"status": StatusCapabilities, "capabilities": map[string]any{},
		"notes": strings.Repeat("n", MaxCapabilitiesHeaderSent)}
	if v, err := CapabilitiesHeader(big); !errors.Is(err, ErrHeaderTooLarge) || v != "" {
		t.Fatalf("an answer past the bound: %d bytes, %v; want ErrHeaderTooLarge", len(v), err)
	}
}
