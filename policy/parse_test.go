package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const fullYAML = `# a policy with every section
version: 1
defaults:
  shell: ask
  network: allow
rules:
  - action: shell
    target: "rm -rf *"
    decision: deny
  - {action: read, target: ".env", decision: deny}
network:
  mode: allowlist
  hosts: [proxy.golang.org, "*.github.com"]
  cidrs: [10.0.0.0/8]
  ports: [443]
limits:
  timeout: 5m
  memory_bytes: 512MiB
  cpus: 1.5
  pids: 256
  output_bytes: 4194304
  file_size_bytes: 2G
  disk_bytes: 8GiB
`

const fullJSON = `{
	"version": 1,
	"defaults": {"shell": "ask", "network": "allow"},
	"rules": [
		{"action": "shell", "target": "rm -rf *", "decision": "deny"},
		{"action": "read", "target": ".env", "decision": "deny"}
	],
	"network": {"mode": "allowlist", "hosts": ["proxy.golang.org", "*.github.com"], "cidrs": ["10.0.0.0/8"], "ports": [443]},
	"limits": {"timeout": 300, "memory_bytes": 536870912, "cpus": 1.5, "pids": 256, "output_bytes": "4MiB", "file_size_bytes": "2GiB", "disk_bytes": 8589934592}
}`

func TestParseFull(t *testing.T) {
	for name, in := range map[string]string{"yaml": fullYAML, "json": fullJSON} {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Evaluate(Shell, "rm -rf /"); got != Deny {
				t.Errorf("rm -rf: %s", got)
			}
			if got := p.Evaluate(Shell, "make"); got != Ask {
				t.Errorf("make: %s (defaults.shell not applied)", got)
			}
			if got := p.Evaluate(Read, ".env"); got != Deny {
				t.Errorf(".env: %s", got)
			}
			if got := p.Evaluate(Secrets, "x"); got != Deny {
				t.Errorf("secrets default not kept from Default(): %s", got)
			}
			if got := p.Evaluate(Write, "x"); got != Ask {
				t.Errorf("write default not kept from Default(): %s", got)
			}
			if !p.Allowed(Network) {
				t.Error("network not allowed")
			}
			if p.Network == nil || p.Network.Mode != NetworkAllowlist || len(p.Network.Hosts) != 2 || p.Network.Ports[0] != 443 {
				t.Errorf("network = %+v", p.Network)
			}
			want := ResourceLimits{Timeout: 5 * time.Minute, MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 256, OutputBytes: 4 << 20, FileSizeBytes: 2 << 30, DiskBytes: 8 << 30}
			if p.Limits != want {
				t.Errorf("limits = %+v, want %+v", p.Limits, want)
			}
		})
	}
}

func TestParseMinimal(t *testing.T) {
	p, err := Parse([]byte("rules: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	for _, a := range Actions() {
		if p.Evaluate(a, "x") != d.Evaluate(a, "x") {
			t.Errorf("%s differs from Default()", a)
		}
	}
	if p.Network != nil {
		t.Errorf("unset network parsed as %+v", p.Network)
	}
}

func TestParseRefuses(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // must appear in the error
	}{
		{"empty", "", "empty"},
		{"comment only", "# nothing\n", "empty"},
		{"not a mapping", "- a\n", "want a mapping"},
		{"unknown top key", "version: 1\nrulez: []\n", "line 2: rulez: invalid policy: unknown key"},
		{"bad version", "version: 2\n", "line 1: version"},
		{"repeated key", "rules: []\nrules: []\n", "line 2: rules: invalid policy: repeated key"},
		{"unknown default action", "defaults:\n  exec: allow\n", "line 2: defaults.exec"},
		{"bad default decision", "defaults:\n  read: yes\n", `line 2: defaults.read: invalid policy: unknown decision "yes"`},
		{"rule unknown key", "rules:\n  - action: read\n    target: x\n    decision: allow\n    when: now\n", "line 5: rules[0].when"},
		{"rule bad action", "rules:\n  - {action: exec, target: x, decision: allow}\n", "line 2: rules[0].action"},
		{"rule bad decision", "rules:\n  - {action: read, target: x, decision: maybe}\n", "rules[0].decision"},
		{"rule bad glob", "rules:\n  - {action: read, target: \"[x\", decision: deny}\n", "line 2: rules[0].target"},
		{"rule empty glob", "rules:\n  - {action: read, target: \"\", decision: deny}\n", "rules[0].target"},
		{"rule missing decision", "rules:\n  - {action: read, target: x}\n", "rules[0].decision: invalid policy: missing"},
		{"rule null target", "rules:\n  - {action: read, target: ~, decision: deny}\n", "rules[0].target"},
		{"rules not a list", "rules: {}\n", "want a list"},
		{"network bad mode", "network:\n  mode: open\n", "line 2: network.mode"},
		{"network no mode", "network:\n  hosts: [a.com]\n", "network"},
		{"network bad host", "network:\n  mode: allowlist\n  hosts: [\"a b\"]\n", "line 3: network.hosts[0]"},
		{"network bad cidr", "network:\n  mode: allowlist\n  cidrs: [10.0.0.0/40]\n", "network.cidrs[0]"},
		{"network bad port", "network:\n  mode: allowlist\n  hosts: [a.com]\n  ports: [0]\n", "network.ports[0]"},
		{"network empty allowlist", "network:\n  mode: allowlist\n", "no hosts"},
		// A network section that lets commands out, beside a switch that
		// keeps them in, would silently mean deny-all.
		{"allowlist with the network denied", "defaults:\n  network: deny\nnetwork: {mode: allowlist, allow: [a.com]}\n",
			"line 2: defaults.network: invalid policy: network.mode allowlist needs the network action allowed; remove defaults.network (or set it to allow), or set network.mode: deny-all"},
		{"allow-all with the network asked", "network: {mode: allow-all}\ndefaults: {network: ask}\n", "line 2: defaults.network"},
		{"allowlist with a rule denying the network", "network: {mode: allowlist, allow: [a.com]}\nrules:\n  - {action: network, target: \"*\", decision: deny}\n",
			"line 3: rules[0]: invalid policy: network.mode allowlist needs the network action allowed; remove this rule"},
		{"negative timeout", "limits:\n  timeout: -1s\n", "line 2: limits.timeout"},
		{"bad timeout", "limits:\n  timeout: soon\n", "limits.timeout"},
		{"negative memory", "limits:\n  memory_bytes: -5\n", "limits.memory_bytes"},
		{"bad size unit", "limits:\n  memory_bytes: 5 parsecs\n", "limits.memory_bytes"},
		{"overflow size", "limits:\n  memory_bytes: 9999999999999TiB\n", "limits.memory_bytes"},
		{"negative cpus", "limits:\n  cpus: -1\n", "limits.cpus"},
		{"nan cpus", "limits:\n  cpus: .nan\n", "limits.cpus"},
		{"string pids", "limits:\n  pids: many\n", "limits.pids"},
		{"unknown limit", "limits:\n  disk: 1\n", "limits.disk"},
		{"image not a string", "image: [a]\n", "line 1: image"},
		{"image empty", "image: \"\"\n", "line 1: image"},
		{"image with space", "image: \"a b\"\n", "line 1: image"},
		{"image flag-like", "image: -rm\n", "line 1: image"},
		{"group_write not a bool", "group_write: 1\n", "line 1: group_write"},
		{"group_write a string", "group_write: \"yes\"\n", "line 1: group_write"},
		{"isolation unknown", "isolation: weak\n", "line 1: isolation"},
		{"isolation upper case", "isolation: Strong\n", "line 1: isolation"},
		{"isolation not a string", "isolation: [strong]\n", "line 1: isolation"},
		{"alias", "rules: &r []\ndefaults: *r\n", "aliases"},
		{"two documents", "rules: []\n---\nrules: []\n", "more than one document"},
		{"syntax", "rules: [\n", "invalid policy"},
		{"json unknown key", `{"rules": [], "extra": 1}`, "extra"},
		{"NUL", "rules: []\x00", "NUL"},
		{"huge", "rules: []\n" + strings.Repeat("#", MaxFileSize), "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse([]byte(tt.in))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse = %v, %v; want ErrInvalid", p, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

// TestParseNetworkSection: a network section that lets commands out
// allows the network action by itself; one that keeps them in (or none)
// leaves the default, deny.
func TestParseNetworkSection(t *testing.T) {
	tests := []struct {
		name, in string
		allowed  bool
		mode     NetworkMode // "" for no network section
	}{
		{"allowlist alone", "network: {mode: allowlist, allow: [proxy.golang.org]}\n", true, NetworkAllowlist},
		{"allowlist, older form", "network:\n  mode: allowlist\n  hosts: [a.com]\n", true, NetworkAllowlist},
		{"allow-all alone", "network: {mode: allow-all}\n", true, NetworkAllowAll},
		{"allowlist and the switch", "defaults: {network: allow}\nnetwork: {mode: allowlist, allow: [a.com]}\n", true, NetworkAllowlist},
		{"allowlist and a rule allowing", "network: {mode: allowlist, allow: [a.com]}\nrules: [{action: network, target: \"*\", decision: allow}]\n", true, NetworkAllowlist},
		{"deny-all", "network: {mode: deny-all}\n", false, NetworkDenyAll},
		{"expose only", "network: {expose: [8000]}\n", false, NetworkDenyAll},
		{"deny-all, the network denied", "defaults: {network: deny}\nnetwork: {mode: deny-all}\n", false, NetworkDenyAll},
		{"no section", "defaults: {shell: allow}\n", false, ""},
		{"no section, the switch alone", "defaults: {network: allow}\n", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Allowed(Network); got != tt.allowed {
				t.Errorf("Allowed(Network) = %v, want %v", got, tt.allowed)
			}
			var mode NetworkMode
			if p.Network != nil {
				mode = p.Network.Mode
			}
			if mode != tt.mode {
				t.Errorf("network mode %q, want %q", mode, tt.mode)
			}
		})
	}
}

// TestParseImage: image: names the Docker image commands run in.
func TestParseImage(t *testing.T) {
	for _, ref := range []string{"pulse-sandbox-toolchain:latest", "registry.local:5000/team/img@sha256:0123abcd", "alpine"} {
		p, err := Parse([]byte("image: " + ref + "\n"))
		if err != nil || p.Image != ref {
			t.Errorf("image %q: %+v, %v", ref, p, err)
		}
	}
}

// TestParseGroupWrite: group_write: true lets a commit keep group write.
func TestParseGroupWrite(t *testing.T) {
	for in, want := range map[string]bool{"group_write: true\n": true, "group_write: false\n": false, "rules: []\n": false} {
		p, err := Parse([]byte(in))
		if err != nil || p.GroupWrite != want {
			t.Errorf("%q: group_write %v, %v; want %v", in, p.GroupWrite, err, want)
		}
	}
}

// TestParseIsolation: isolation: strong is the one level a file names.
func TestParseIsolation(t *testing.T) {
	for in, want := range map[string]IsolationLevel{"isolation: strong\n": IsolationStrong, `{"isolation": "strong"}`: IsolationStrong, "rules: []\n": ""} {
		p, err := Parse([]byte(in))
		if err != nil || p.Isolation != want {
			t.Errorf("%q: isolation %q, %v; want %q", in, p.Isolation, err, want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(good, []byte(fullYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(good)
	if err != nil || p.Evaluate(Shell, "rm -rf /") != Deny {
		t.Fatalf("Load = %v, %v", p, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"rules": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("Load(bad) = %v, want ErrInvalid naming the file", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{fullYAML, fullJSON, "", "rules: []", "defaults: {read: deny}",
		"rules:\n  - {action: read, target: \"[!a-z]*\", decision: ask}\n", "network: {mode: deny-all}", "network: {expose: [8000, 3000]}", "network: {expose: [8000, 3000-3999, \"9000-9001\"]}",
		"limits: {timeout: 1.5, memory_bytes: 1KiB}", "a: &x 1\nb: *x\n", "image: pulse-sandbox:latest", "caches: [{name: go-mod, env: GOMODCACHE, max_bytes: 1GiB}]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			if p != nil {
				t.Fatal("policy returned with an error")
			}
			return
		}
		// Whatever parses must be valid and fully decided.
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed policy does not validate: %v", err)
		}
		for _, a := range Actions() {
			if d := p.Evaluate(a, "some/target"); !d.Valid() {
				t.Fatalf("Evaluate(%s) = %q", a, d)
			}
		}
	})
}

func FuzzGlob(f *testing.F) {
	for _, s := range []string{"*", "a*b", "[a-c]", "[!x]", `\*`, "[", "*?*"} {
		f.Add(s, "abc")
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		// Matching costs len(pattern)*len(name) at worst; keep each run short.
		if len(pattern) > 512 || len(name) > 512 {
			return
		}
		ok, err := matchGlob(pattern, name)
		if err != nil {
			if ok || !errors.Is(err, ErrInvalid) {
				t.Fatalf("matchGlob(%q, %q) = %v, %v", pattern, name, ok, err)
			}
			return
		}
		// A valid pattern always matches itself with its metacharacters
		// quoted, and "*" around it matches anything containing name.
		if strings.ContainsAny(name, `*?[\`) {
			return
		}
		if m, err := matchGlob("*"+name+"*", "x"+name+"y"); err != nil || !m {
			t.Fatalf("*%q* does not match x%qy: %v", name, name, err)
		}
	})
}
