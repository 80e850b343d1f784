package policy

import (
	"encoding/json"
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
		"zero":              "network: {expose: [0]}",
		"too large":         "network: {expose: [65536]}",
		"not a number":      "network: {expose: [http]}",
		"twice":             "network: {mode: deny-all, expose: [8000, 8000]}",
		"not a list":        "network: {expose: 8000}",
		"ports no mode":     "network: {expose: [8000], ports: [443]}",
		"range upside down": "network: {expose: [3999-3000]}",
		"range from zero":   "network: {expose: [0-10]}",
		"range too large":   "network: {expose: [\"65000-65536\"]}",
		"range open":        "network: {expose: [3000-]}",
		"range signed":      "network: {expose: [\"+1-5\"]}",
		"range of three":    "network: {expose: [1-2-3]}",
		"range spaced":      "network: {expose: [\"1 - 2\"]}",
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

// TestParseExposeRanges: expose takes ranges beside ports; a port in a
// range is exposed, one beside it is not, and the ranges survive the JSON
// a policy travels to pulse-server in.
func TestParseExposeRanges(t *testing.T) {
	p, err := Parse([]byte(`network: {expose: [8000, 3000-3999, "9000-9000"]}`))
	if err != nil {
		t.Fatal(err)
	}
	n := p.Network
	if n.Mode != NetworkDenyAll || !slices.Equal(n.Expose, []int{8000}) ||
		!slices.Equal(n.ExposeRanges, []PortRange{{3000, 3999}, {9000, 9000}}) {
		t.Fatalf("parsed %+v", n)
	}
	for port, want := range map[int]bool{8000: true, 3000: true, 3500: true, 3999: true, 9000: true,
		2999: false, 4000: false, 8999: false, 9001: false, 8001: false} {
		if n.Exposes(port) != want {
			t.Errorf("Exposes(%d) = %v, want %v", port, !want, want)
		}
	}
	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	var back NetworkPolicy
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if !slices.Equal(back.ExposeRanges, n.ExposeRanges) || !back.Exposes(3456) {
		t.Errorf("after JSON %s: %+v", b, back)
	}
	if err := json.Unmarshal([]byte(`{"mode":"deny-all","expose_ranges":["5-1"]}`), &back); !errors.Is(err, ErrInvalid) {
		t.Errorf("an upside-down range in JSON: err = %v, want ErrInvalid", err)
	}
	if err := (NetworkPolicy{Mode: NetworkDenyAll, ExposeRanges: []PortRange{{0, 5}}}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Validate of range 0-5: %v, want ErrInvalid", err)
	}
}

// FuzzParsePortRange: what parses is a valid range that prints back as
// it was read (leading zeros aside) and contains its ends.
func FuzzParsePortRange(f *testing.F) {
	for _, s := range []string{"3000-3999", "1-65535", "8080-8080", "0-1", "5-1", "-", "1-", "65535-65536", "007-9", "1-2-3", " 1-2", "+1-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParsePortRange(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if r.From < 1 || r.To > 65535 || r.From > r.To || !r.Contains(r.From) || !r.Contains(r.To) {
			t.Fatalf("%q parsed to invalid %+v", s, r)
		}
		again, err := ParsePortRange(r.String())
		if err != nil || again != r {
			t.Fatalf("%q: %v printed %q, parsed back %+v, %v", s, r, r.String(), again, err)
		}
	})
}
