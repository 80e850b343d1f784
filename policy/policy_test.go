package policy

import (
	"errors"
	"math"
	"path"
	"strings"
	"testing"
	"time"
)

func TestParseActionAndDecision(t *testing.T) {
	for _, a := range Actions() {
		got, err := ParseAction(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAction(%q) = %q, %v", a, got, err)
		}
	}
	if len(Actions()) != 7 {
		t.Errorf("Actions() has %d entries, want 7", len(Actions()))
	}
	for _, bad := range []string{"", "READ", "exec", "read "} {
		if _, err := ParseAction(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseAction(%q) err = %v, want ErrInvalid", bad, err)
		}
	}
	for _, d := range []Decision{Allow, Deny, Ask} {
		got, err := ParseDecision(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDecision(%q) = %q, %v", d, got, err)
		}
	}
	for _, bad := range []string{"", "Allow", "maybe"} {
		if _, err := ParseDecision(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseDecision(%q) err = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestDefault(t *testing.T) {
	p := Default()
	want := map[Action]Decision{
		Read: Allow, Write: Ask, Delete: Ask, Shell: Allow, Git: Ask, Network: Deny, Secrets: Deny,
	}
	for a, d := range want {
		if got := p.Evaluate(a, "anything"); got != d {
			t.Errorf("Default().Evaluate(%s) = %s, want %s", a, got, d)
		}
	}
	if p.Allowed(Network) || p.Allowed(Secrets) || p.Allowed(Write) {
		t.Error("Default allows network, secrets or unstaged writes")
	}
	if !p.Allowed(Read) || !p.Allowed(Shell) {
		t.Error("Default does not allow read or shell")
	}
	if err := p.Validate(); err != nil {
		t.Errorf("Default does not validate: %v", err)
	}
}

func TestEvaluateFirstMatchWins(t *testing.T) {
	p := &Policy{
		Rules: []Rule{
			{Shell, "rm -rf *", Deny},
			{Shell, "go *", Allow},
			{Shell, "*", Ask},
			{Read, ".env", Deny},
			{Read, "secrets/*", Deny},
			{Read, "*.go", Allow},
			{Write, "vendor/*", Deny},
			{Write, "*", Allow},
			{Write, "docs/*", Deny}, // shadowed by the rule before it
		},
		Defaults: map[Action]Decision{Read: Ask, Shell: Deny},
	}
	tests := []struct {
		a      Action
		target string
		want   Decision
	}{
		{Shell, "rm -rf /", Deny},
		{Shell, "go test ./...", Allow},
		{Shell, "make", Ask},
		{Read, ".env", Deny},
		{Read, "./.env", Deny},
		{Read, "secrets/deep/key.pem", Deny},
		{Read, "main.go", Allow},
		{Read, "pkg/x.go", Allow},
		{Read, "README.md", Ask},
		{Write, "vendor/a/b.go", Deny},
		{Write, "docs/x.md", Allow},
		{Delete, "x", Deny},         // no default: fail closed
		{Action("exec"), "x", Deny}, // unknown action
	}
	for _, tt := range tests {
		if got := p.Evaluate(tt.a, tt.target); got != tt.want {
			t.Errorf("Evaluate(%s, %q) = %s, want %s", tt.a, tt.target, got, tt.want)
		}
	}
	var nilp *Policy
	if nilp.Evaluate(Read, "x") != Deny || nilp.Allowed(Read) {
		t.Error("nil policy does not deny")
	}
}

func TestEvaluateBadGlobFailsClosed(t *testing.T) {
	p := &Policy{Rules: []Rule{{Read, "[unclosed", Allow}}, Defaults: map[Action]Decision{Read: Allow}}
	if got := p.Evaluate(Read, "x"); got != Deny {
		t.Errorf("Evaluate with a malformed glob = %s, want deny", got)
	}
	if err := p.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "rules[0]") {
		t.Errorf("Validate err = %v, want ErrInvalid naming rules[0]", err)
	}
}

func TestAllowed(t *testing.T) {
	tests := []struct {
		name string
		p    *Policy
		want bool
	}{
		{"default allow", &Policy{Defaults: map[Action]Decision{Network: Allow}}, true},
		{"default deny", &Policy{Defaults: map[Action]Decision{Network: Deny}}, false},
		{"no default", &Policy{}, false},
		{"allow rule only", &Policy{Rules: []Rule{{Network, "*", Allow}}, Defaults: map[Action]Decision{Network: Allow}}, true},
		{"one deny rule", &Policy{Rules: []Rule{{Network, "evil.com", Deny}}, Defaults: map[Action]Decision{Network: Allow}}, false},
		{"ask rule", &Policy{Rules: []Rule{{Network, "*", Ask}}, Defaults: map[Action]Decision{Network: Allow}}, false},
		{"deny rule for another action", &Policy{Rules: []Rule{{Read, "*", Deny}}, Defaults: map[Action]Decision{Network: Allow}}, true},
	}
	for _, tt := range tests {
		if got := tt.p.Allowed(Network); got != tt.want {
			t.Errorf("%s: Allowed = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"*", "", true},
		{"*", "a/b c", true},
		{"a*", "a", true},
		{"a*b", "a/x/b", true},
		{"a*b", "a/x/bc", false},
		{"*.go", "x.go", true},
		{"*.go", "x.gox", false},
		{"?", "a", true},
		{"?", "", false},
		{"??", "a", false},
		{"[abc]", "b", true},
		{"[abc]", "d", false},
		{"[!abc]", "d", true},
		{"[!abc]", "a", false},
		{"[a-c]x", "bx", true},
		{"[a-c]x", "dx", false},
		{"[]]", "]", true},
		{"[a-]", "-", true},
		{`\*`, "*", true},
		{`\*`, "a", false},
		{`[\]]`, "]", true},
		{"*a*a*a*a*a*a*a*b", strings.Repeat("a", 60), false},
		{"go test *", "go test ./...", true},
		{"", "", true},
		{"", "a", false},
	}
	for _, tt := range tests {
		got, err := matchGlob(tt.pattern, tt.name)
		if err != nil || got != tt.want {
			t.Errorf("matchGlob(%q, %q) = %v, %v; want %v", tt.pattern, tt.name, got, err, tt.want)
		}
	}
	for _, bad := range []string{"[", "[a", "[]", "a\\", "[z-a]", "[\\"} {
		if err := ValidGlob(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidGlob(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if err := ValidGlob(""); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty glob accepted: %v", err)
	}
}

// TestGlobAgreesWithPathMatch checks the matcher against the standard
// library on names without "/", where the two languages coincide.
func TestGlobAgreesWithPathMatch(t *testing.T) {
	patterns := []string{"*", "a*", "*b", "a?c", "[ab]*", "[^a]?", "*x*y*", "[a-c][^d-f]", `\[a`, "[\\]a]"}
	names := []string{"", "a", "ab", "abc", "b", "bx", "xay", "axbyc", "cd", "[a", "ag"}
	for _, p := range patterns {
		for _, n := range names {
			want, err := path.Match(p, n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := matchGlob(p, n)
			if err != nil || got != want {
				t.Errorf("matchGlob(%q, %q) = %v, %v; path.Match says %v", p, n, got, err, want)
			}
		}
	}
}

func TestNetworkPolicy(t *testing.T) {
	valid := []NetworkPolicy{
		DenyAllNetwork(),
		{Mode: NetworkAllowAll},
		{Mode: NetworkAllowlist, Hosts: []string{"proxy.golang.org", "*.github.com", "10.1.2.3"}},
		{Mode: NetworkAllowlist, CIDRs: []string{"10.0.0.0/8", "fd00::/8", "192.168.1.1"}, Ports: []int{443}},
	}
	for _, n := range valid {
		if err := n.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", n, err)
		}
	}
	invalid := []NetworkPolicy{
		{},
		{Mode: "open"},
		{Mode: NetworkDenyAll, Hosts: []string{"a.com"}},
		{Mode: NetworkAllowAll, Ports: []int{80}},
		{Mode: NetworkAllowlist},
		{Mode: NetworkAllowlist, Hosts: []string{"bad host"}},
		{Mode: NetworkAllowlist, Hosts: []string{"-a.com"}},
		{Mode: NetworkAllowlist, Hosts: []string{""}},
		{Mode: NetworkAllowlist, Hosts: []string{strings.Repeat("a", 64) + ".com"}},
		{Mode: NetworkAllowlist, CIDRs: []string{"10.0.0.0/33"}},
		{Mode: NetworkAllowlist, CIDRs: []string{"example.com"}},
		{Mode: NetworkAllowlist, Hosts: []string{"a.com"}, Ports: []int{0}},
		{Mode: NetworkAllowlist, Hosts: []string{"a.com"}, Ports: []int{65536}},
	}
	for _, n := range invalid {
		if err := n.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalid", n, err)
		}
	}
}

func TestNetworkAllows(t *testing.T) {
	n := NetworkPolicy{
		Mode:  NetworkAllowlist,
		Hosts: []string{"proxy.golang.org", "*.github.com", "192.0.2.7"},
		CIDRs: []string{"10.0.0.0/8"},
		Ports: []int{443},
	}
	tests := []struct {
		host string
		port int
		want bool
	}{
		{"proxy.golang.org", 443, true},
		{"PROXY.golang.org.", 443, true},
		{"proxy.golang.org", 80, false},
		{"api.github.com", 443, true},
		{"github.com", 443, false},
		{"evilgithub.com", 443, false},
		{"10.2.3.4", 443, true},
		{"::ffff:10.2.3.4", 443, true},
		{"11.0.0.1", 443, false},
		{"192.0.2.7", 443, true},
		{"example.com", 443, false},
	}
	for _, tt := range tests {
		if got := n.Allows(tt.host, tt.port); got != tt.want {
			t.Errorf("Allows(%q, %d) = %v, want %v", tt.host, tt.port, got, tt.want)
		}
	}
	if DenyAllNetwork().Allows("127.0.0.1", 80) {
		t.Error("deny-all allows")
	}
	if !(NetworkPolicy{Mode: NetworkAllowAll}).Allows("example.com", 1) {
		t.Error("allow-all denies")
	}
	if (NetworkPolicy{Mode: "bogus"}).Allows("example.com", 1) {
		t.Error("invalid policy allows")
	}
}

func TestResourceLimits(t *testing.T) {
	if err := (ResourceLimits{}).Validate(); err != nil {
		t.Errorf("zero limits: %v", err)
	}
	ok := ResourceLimits{Timeout: time.Minute, MemoryBytes: 1 << 30, CPUs: 1.5, Pids: 100, OutputBytes: 1 << 20, FileSizeBytes: 1 << 20}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid limits: %v", err)
	}
	for name, l := range map[string]ResourceLimits{
		"timeout":         {Timeout: -1},
		"memory_bytes":    {MemoryBytes: -1},
		"cpus":            {CPUs: -0.5},
		"pids":            {Pids: -1},
		"output_bytes":    {OutputBytes: -1},
		"file_size_bytes": {FileSizeBytes: -1},
		"disk_bytes":      {DiskBytes: -1},
	} {
		err := l.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), name) {
			t.Errorf("%s: Validate = %v, want ErrInvalid naming the field", name, err)
		}
	}
	for _, c := range []float64{math.NaN(), math.Inf(1)} {
		if err := (ResourceLimits{CPUs: c}).Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("CPUs %v accepted", c)
		}
	}
	d := ResourceLimits{}.WithDefaults()
	if d.Timeout != DefaultTimeout || d.OutputBytes != DefaultOutputBytes {
		t.Errorf("WithDefaults = %+v", d)
	}
}

func FuzzNetworkAllows(f *testing.F) {
	for _, s := range []string{"proxy.golang.org", "API.GitHub.com.", "10.1.2.3", "[::1]", "::ffff:10.0.0.1", "", "*", "fe80::1%eth0"} {
		f.Add(s, 443)
	}
	n := NetworkPolicy{
		Mode:  NetworkAllowlist,
		Hosts: []string{"proxy.golang.org", "*.github.com"},
		CIDRs: []string{"10.0.0.0/8"},
		Ports: []int{443},
	}
	f.Fuzz(func(t *testing.T, host string, port int) {
		if DenyAllNetwork().Allows(host, port) {
			t.Fatal("deny-all allowed a host")
		}
		if !n.Allows(host, port) {
			return
		}
		if port != 443 {
			t.Fatalf("allowed port %d", port)
		}
		h := strings.TrimSuffix(strings.ToLower(host), ".")
		if h != "proxy.golang.org" && !strings.HasSuffix(h, ".github.com") {
			a, err := ParseCIDR(strings.Trim(h, "[]"))
			if err != nil || !a.Addr().Is4() && !a.Addr().Is4In6() || a.Addr().Unmap().As4()[0] != 10 {
				t.Fatalf("allowed %q", host)
			}
		}
	})
}
