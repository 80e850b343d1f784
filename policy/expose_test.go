package policy

import (
	"errors"
	"slices"
	"testing"
)

func TestParseExpose(t *testing.T) {
	for name, tc := range map[string]struct {
		in   string
		mode NetworkMode
		want []int
	}{
		"alone means deny-all": {"network: {expose: [8000]}", NetworkDenyAll, []int{8000}},
		"with deny-all":        {"network: {mode: deny-all, expose: [8000, 3000]}", NetworkDenyAll, []int{8000, 3000}},
		"with allow-all":       {"network: {mode: allow-all, expose: [80]}", NetworkAllowAll, []int{80}},
		"with an allowlist":    {"network: {mode: allowlist, allow: [proxy.golang.org], expose: [65535]}", NetworkAllowlist, []int{65535}},
	} {
		p, err := Parse([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if p.Network.Mode != tc.mode || !slices.Equal(p.Network.Expose, tc.want) {
			t.Errorf("%s: mode %q expose %v; want %q %v", name, p.Network.Mode, p.Network.Expose, tc.mode, tc.want)
		}
		for _, port := range tc.want {
			if !p.Network.Exposes(port) {
				t.Errorf("%s: Exposes(%d) is false", name, port)
			}
		}
		if p.Network.Exposes(1) {
			t.Errorf("%s: Exposes(1) for an unlisted port", name)
		}
	}
	for name, in := range map[string]string{
		"zero":          "network: {expose: [0]}",
		"too large":     "network: {expose: [65536]}",
		"not a number":  "network: {expose: [http]}",
		"twice":         "network: {mode: deny-all, expose: [8000, 8000]}",
		"not a list":    "network: {expose: 8000}",
		"ports no mode": "network: {expose: [8000], ports: [443]}",
	} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestValidateExpose(t *testing.T) {
	ok := NetworkPolicy{Mode: NetworkDenyAll, Expose: []int{8000}}
	if err := ok.Validate(); err != nil {
		t.Errorf("deny-all with expose: %v", err)
	}
	for _, bad := range []NetworkPolicy{
		{Mode: NetworkDenyAll, Expose: []int{-1}},
		{Mode: NetworkAllowAll, Expose: []int{70000}},
		{Mode: NetworkDenyAll, Expose: []int{22, 22}},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: err = %v, want ErrInvalid", bad, err)
		}
	}
}
