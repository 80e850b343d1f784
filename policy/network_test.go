package policy

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseAllowEntry(t *testing.T) {
	for _, tt := range []struct {
		in     string
		host   string
		prefix string
		ports  []int
	}{
		{"proxy.golang.org", "proxy.golang.org", "", []int{80, 443}},
		{"API.GitHub.com.", "api.github.com", "", []int{80, 443}},
		{"*.github.com", "*.github.com", "", []int{80, 443}},
		{"example.com:8443", "example.com", "", []int{8443}},
		{"example.com:*", "example.com", "", nil},
		{"localhost:8080", "localhost", "", []int{8080}},
		{"127.0.0.1", "", "127.0.0.1/32", []int{80, 443}},
		{"127.0.0.1:9000", "", "127.0.0.1/32", []int{9000}},
		{"::1", "", "::1/128", []int{80, 443}},
		{"[::1]:8080", "", "::1/128", []int{8080}},
		{"[2001:db8::/32]:443", "", "2001:db8::/32", []int{443}},
		{"10.0.0.0/8", "", "10.0.0.0/8", []int{80, 443}},
		{"10.1.2.3/8:443", "", "10.0.0.0/8", []int{443}},
		{"fd00::/8:22", "", "fd00::/8", []int{22}},
		{"::ffff:10.0.0.1", "", "10.0.0.1/32", []int{80, 443}},
	} {
		e, err := ParseAllowEntry(tt.in)
		if err != nil {
			t.Errorf("%q: %v", tt.in, err)
			continue
		}
		prefix := ""
		if e.Prefix.IsValid() {
			prefix = e.Prefix.String()
		}
		if e.Host != tt.host || prefix != tt.prefix || !slices.Equal(e.Ports, tt.ports) || e.Rule != tt.in {
			t.Errorf("%q = %+v", tt.in, e)
		}
	}
	for _, bad := range []string{
		"", " a.com", "a.com:", "a.com:0", "a.com:65536", "a.com:08", "a.com:x", "a b.com", "-a.com",
		"*", "*.", "a.*.com", "*a.com", "**.com", "*.10.0.0.1", "[::1", "[::1]x", "[a.com]:80",
		"10.0.0.0/33", "10.0.0.0/8:", "10.0.0.0/8:0", "fe80::1%eth0", "[fe80::1%eth0]:80", "1.2.3.4:5:6",
		strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 200),
	} {
		if _, err := ParseAllowEntry(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q accepted (err %v)", bad, err)
		}
	}
}

func TestNetworkCheck(t *testing.T) {
	n := NetworkPolicy{Mode: NetworkAllowlist, Allow: []string{
		"proxy.golang.org", "*.github.com", "example.com:8443", "localhost:8080",
		"127.0.0.1:9000", "10.0.0.0/8:443", "0.0.0.0/0:7000", "[::1]:9001", "wide.example:*",
	}}
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		host string
		port int
		want bool
	}{
		{"proxy.golang.org", 443, true},
		{"proxy.golang.org", 80, true},
		{"proxy.golang.org", 22, false},
		{"PROXY.golang.org.", 443, true},
		{"evil.proxy.golang.org", 443, false},
		{"api.github.com", 443, true},
		{"github.com", 443, false},
		{"example.com", 443, false},
		{"example.com", 8443, true},
		{"wide.example", 1, true},
		{"127.0.0.1", 9000, true},
		{"127.0.0.1", 9001, false},
		{"127.0.0.2", 9000, false},
		{"[::1]", 9001, true},
		{"::1", 9000, false},
		{"10.9.9.9", 443, true},
		{"10.9.9.9", 80, false},
		{"8.8.8.8", 7000, true},
		{"127.0.0.1", 7000, false}, // 0.0.0.0/0 does not list loopback
		{"192.168.1.1", 7000, false},
		{"169.254.169.254", 7000, false},
		{"::ffff:127.0.0.1", 9000, true},
		{"other.com", 443, false},
		{"proxy.golang.org", 0, false},
	} {
		if got := n.CheckHost(tt.host, tt.port); got.Allowed != tt.want || (got.Allowed && got.Rule == "") || (!got.Allowed && got.Reason == "") {
			t.Errorf("CheckHost(%q, %d) = %+v, want %v", tt.host, tt.port, got, tt.want)
		}
	}
	for _, tt := range []struct {
		host string
		addr string
		port int
		want bool
	}{
		{"proxy.golang.org", "142.250.1.1", 443, true},
		{"proxy.golang.org", "127.0.0.1", 443, false}, // rebinding to loopback
		{"proxy.golang.org", "10.1.1.1", 443, true},   // 10.0.0.0/8:443 lists it
		{"proxy.golang.org", "10.1.1.1", 80, false},
		{"proxy.golang.org", "192.168.0.1", 443, false},
		{"proxy.golang.org", "169.254.169.254", 80, false},
		{"proxy.golang.org", "::1", 443, false},
		{"proxy.golang.org", "fe80::1", 443, false},
		{"localhost", "127.0.0.1", 8080, true},
		{"localhost", "::1", 8080, true},
		{"localhost", "10.0.0.1", 8080, false},
		{"other.com", "142.250.1.1", 443, false},
	} {
		if got := n.CheckResolved(tt.host, netip.MustParseAddr(tt.addr), tt.port); got.Allowed != tt.want {
			t.Errorf("CheckResolved(%q, %s, %d) = %+v, want %v", tt.host, tt.addr, tt.port, got, tt.want)
		}
	}
	// The older keys keep their meaning: any port unless ports is set.
	old := NetworkPolicy{Mode: NetworkAllowlist, Hosts: []string{"a.com"}, CIDRs: []string{"192.0.2.0/24"}}
	if !old.Allows("a.com", 22) || !old.Allows("192.0.2.9", 5432) || old.Allows("b.com", 443) {
		t.Error("hosts/cidrs without ports changed meaning")
	}
	if (NetworkPolicy{Mode: NetworkDenyAll}).CheckHost("a.com", 443).Allowed {
		t.Error("deny-all allowed")
	}
	if (NetworkPolicy{Mode: NetworkDenyAll, Allow: []string{"a.com"}}).Validate() == nil {
		t.Error("deny-all with allow entries validated")
	}
}

func TestParseNetworkAllowAndInject(t *testing.T) {
	p, err := Parse([]byte(`
defaults: {network: allow}
network:
  mode: allowlist
  allow: [proxy.golang.org, "127.0.0.1:8080"]
secrets:
  inject:
    - {env: GITHUB_TOKEN, hosts: ["api.github.com"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Network.Allow, []string{"proxy.golang.org", "127.0.0.1:8080"}) {
		t.Errorf("allow = %v", p.Network.Allow)
	}
	if len(p.Inject) != 1 || p.Inject[0].Env != "GITHUB_TOKEN" || !p.Inject[0].Matches("API.github.com") || p.Inject[0].Matches("github.com") {
		t.Errorf("inject = %+v", p.Inject)
	}
	for name, in := range map[string]string{
		"bad entry":     "network: {mode: allowlist, allow: [\"a.com:0\"]}",
		"entry type":    "network: {mode: allowlist, allow: [{a: b}]}",
		"unknown key":   "secrets: {inject: [{env: A, hosts: [a.com], port: 1}]}",
		"missing hosts": "secrets: {inject: [{env: A}]}",
		"address host":  "secrets: {inject: [{env: A, hosts: [\"10.0.0.1\"]}]}",
		"bad env":       "secrets: {inject: [{env: \"A-B\", hosts: [a.com]}]}",
		"secrets key":   "secrets: {allow: [A]}",
	} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// FuzzParseAllowEntry: entries come from policy files and the command line.
// Whatever parses must be a name entry or an address entry, never both,
// with sane ports, and must match itself.
func FuzzParseAllowEntry(f *testing.F) {
	for _, s := range []string{"a.com", "*.a.com:443", "[::1]:80", "10.0.0.0/8:443", "fd00::/8:22", "1.2.3.4", "h:*", "::ffff:1.2.3.4", "[1::]/9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseAllowEntry(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if (e.Host == "") == !e.Prefix.IsValid() {
			t.Fatalf("%q: entry %+v is not exactly one of name and address", s, e)
		}
		for _, p := range e.Ports {
			if p < 1 || p > 65535 {
				t.Fatalf("%q: port %d", s, p)
			}
		}
		if e.Host != "" && !strings.HasPrefix(e.Host, "*.") && !e.MatchName(e.Host) {
			t.Fatalf("%q does not match itself", s)
		}
		if e.Prefix.IsValid() && !e.Prefix.Contains(e.Prefix.Addr()) {
			t.Fatalf("%q: prefix %v", s, e.Prefix)
		}
		n := NetworkPolicy{Mode: NetworkAllowlist, Allow: []string{s}}
		if err := n.Validate(); err != nil {
			t.Fatalf("%q parses but does not validate: %v", s, err)
		}
	})
}

func TestNetworkModeValid(t *testing.T) {
	for _, m := range []NetworkMode{NetworkDenyAll, NetworkAllowAll, NetworkAllowlist} {
		if !m.Valid() {
			t.Errorf("%q is not Valid", m)
		}
	}
	for _, m := range []NetworkMode{"", "open", "Deny-All", "deny_all"} {
		if m.Valid() {
			t.Errorf("%q is Valid", m)
		}
	}
}
