package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds a policy file. Policies are short; a larger input is
// a mistake or an attack on the parser.
const MaxFileSize = 1 << 20

// FileVersion is the only policy file version Parse accepts.
const FileVersion = 1

// Parse reads a policy file, YAML or JSON (JSON is read as the YAML subset
// it is). The format:
//
//	version: 1                # optional; must be 1
//	defaults:                 # optional; actions left out keep Default()'s
//	  shell: ask
//	rules:                    # first match wins
//	  - {action: shell, target: "rm -rf *", decision: deny}
//	  - {action: read, target: ".env", decision: deny}
//	network:                  # optional; see NetworkPolicy. allowlist or allow-all
//	  mode: allowlist         # allows the network action too (no defaults.network needed)
//	  allow: [proxy.golang.org, "*.github.com", "127.0.0.1:8080", "10.0.0.0/8:443"]
//	  hosts: [example.org]     # the older form: any port unless ports is set
//	  cidrs: [192.0.2.0/24]
//	  ports: [443]
//	  expose: [8000, 3000-3999]  # inbound: ports (and ranges) sandbox.Expose may reach, any mode;
//	                           # a section with only expose means mode deny-all
//	secrets:                  # optional
//	  inject:                 # the command sees a placeholder; the proxy puts
//	    - {env: GITHUB_TOKEN, hosts: [api.github.com]}  # the value in headers to these hosts
//	image: pulse-sandbox-toolchain:latest  # optional; the Docker image commands run in
//	caches:                   # optional; see Cache: shared, never reviewed
//	  - {name: go-mod, env: GOMODCACHE}                  # at /cache/go-mod
//	  - {name: go-build, env: GOCACHE, path: /cache/go-build, max_bytes: 4GiB}
//	limits:                   # optional; see ResourceLimits
//	  timeout: 5m             # a Go duration, or a number of seconds
//	  memory_bytes: 512MiB    # bytes, or a number with K/M/G/KiB/MiB/GiB
//	  cpus: 1.5
//	  pids: 256
//	  output_bytes: 4MiB
//	  file_size_bytes: 50MiB
//	  disk_bytes: 2GiB        # what a running command may write in all
//
// A network section in mode allowlist or allow-all allows the network
// action by itself; beside a defaults.network or a network rule that is
// not allow it is refused (the two together would mean no network at
// all), the error naming the line and what to remove.
//
// Parsing is strict: unknown or repeated keys, wrong types, unknown
// actions, decisions or modes, malformed globs, hosts or CIDRs, negative
// limits, anchors and aliases, and more than one document are errors that
// wrap ErrInvalid and name the line and field.
func Parse(data []byte) (*Policy, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%w: policy larger than %d bytes", ErrInvalid, MaxFileSize)
	}
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, fmt.Errorf("%w: NUL byte in policy", ErrInvalid)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty policy", ErrInvalid)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one document", ErrInvalid)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, fmt.Errorf("%w: empty policy", ErrInvalid)
	}
	p := Default()
	if err := decodeFile(doc.Content[0], p); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		// decodeFile checks everything with line numbers; this is a net.
		return nil, err
	}
	return p, nil
}

// Load reads and parses the policy file at path.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy: %s: %w", path, err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("policy: %s: %w", path, err)
	}
	return p, nil
}

// fieldErr names the line and the dotted field of a problem.
func fieldErr(n *yaml.Node, field, format string, args ...any) error {
	return fmt.Errorf("line %d: %s: %w: %s", n.Line, field, ErrInvalid, fmt.Sprintf(format, args...))
}

// mapping checks that n is a mapping with only known, unrepeated keys and
// calls fn for each entry.
func mapping(n *yaml.Node, field string, known []string, fn func(key string, v *yaml.Node) error) error {
	if err := noAlias(n, field); err != nil {
		return err
	}
	if n.Kind != yaml.MappingNode {
		return fieldErr(n, field, "want a mapping")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return fieldErr(k, field, "keys must be plain strings")
		}
		name := join(field, k.Value)
		ok := false
		for _, kn := range known {
			ok = ok || kn == k.Value
		}
		if !ok {
			return fieldErr(k, name, "unknown key (want one of %s)", strings.Join(known, ", "))
		}
		if seen[k.Value] {
			return fieldErr(k, name, "repeated key")
		}
		seen[k.Value] = true
		if err := noAlias(v, name); err != nil {
			return err
		}
		if err := fn(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

func noAlias(n *yaml.Node, field string) error {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return fieldErr(n, field, "anchors and aliases are not allowed")
	}
	return nil
}

func sequence(n *yaml.Node, field string, fn func(i int, v *yaml.Node) error) error {
	if n.Kind != yaml.SequenceNode {
		return fieldErr(n, field, "want a list")
	}
	for i, v := range n.Content {
		name := fmt.Sprintf("%s[%d]", field, i)
		if err := noAlias(v, name); err != nil {
			return err
		}
		if err := fn(i, v); err != nil {
			return err
		}
	}
	return nil
}

func scalarString(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || n.Tag == "!!binary" || n.Tag == "!!map" || n.Tag == "!!seq" {
		return "", fieldErr(n, field, "want a string")
	}
	return n.Value, nil
}

func scalarInt(n *yaml.Node, field string) (int64, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, fieldErr(n, field, "want an integer")
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return 0, fieldErr(n, field, "want a decimal integer, got %q", n.Value)
	}
	return v, nil
}

func decodeFile(n *yaml.Node, p *Policy) error {
	known := []string{"version", "defaults", "rules", "network", "limits", "secrets", "image", "caches", "group_write", "isolation"}
	var sw netSwitch
	err := mapping(n, "", known, func(key string, v *yaml.Node) error {
		switch key {
		case "version":
			ver, err := scalarInt(v, key)
			if err != nil {
				return err
			}
			if ver != FileVersion {
				return fieldErr(v, key, "unsupported version %d (want %d)", ver, FileVersion)
			}
		case "defaults":
			return mapping(v, key, actionNames(), func(a string, d *yaml.Node) error {
				dec, err := decision(d, join(key, a))
				if err != nil {
					return err
				}
				if Action(a) == Network {
					sw.def = d
				}
				p.Defaults[Action(a)] = dec
				return nil
			})
		case "rules":
			return sequence(v, key, func(i int, r *yaml.Node) error {
				rule, err := decodeRule(r, fmt.Sprintf("rules[%d]", i))
				if err != nil {
					return err
				}
				p.Rules = append(p.Rules, rule)
				if rule.Action == Network {
					sw.rules = append(sw.rules, netRule{i, r})
				}
				return nil
			})
		case "network":
			np, err := decodeNetwork(v, key)
			if err != nil {
				return err
			}
			p.Network = &np
		case "limits":
			l, err := decodeLimits(v, key)
			if err != nil {
				return err
			}
			p.Limits = l
		case "secrets":
			in, err := decodeSecrets(v, key)
			if err != nil {
				return err
			}
			p.Inject = in
		case "image":
			ref, err := scalarString(v, key)
			if err != nil {
				return err
			}
			if err := validImageRef(ref); err != nil {
				return fieldErr(v, key, "%v", err)
			}
			p.Image = ref
		case "caches":
			cs, err := decodeCaches(v, key)
			if err != nil {
				return err
			}
			p.Caches = cs
		case "isolation":
			lv, err := scalarString(v, key)
			if err != nil {
				return err
			}
			if IsolationLevel(lv) != IsolationStrong {
				return fieldErr(v, key, "unknown level %q (want strong, or leave it out)", lv)
			}
			p.Isolation = IsolationStrong
		case "group_write":
			if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
				return fieldErr(v, key, "want true or false")
			}
			b, err := strconv.ParseBool(v.Value)
			if err != nil {
				return fieldErr(v, key, "want true or false, got %q", v.Value)
			}
			p.GroupWrite = b
		}
		return nil
	})
	if err != nil {
		return err
	}
	return sw.apply(p)
}

// validImageRef accepts what an image reference can be (name[:tag] or
// name@digest, with an optional registry host), without contacting any
// registry.
func validImageRef(ref string) error {
	if ref == "" || len(ref) > 512 {
		return errors.New("want an image reference such as pulse-sandbox-toolchain:latest")
	}
	for _, r := range ref {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/:@+", r)) {
			return fmt.Errorf("image reference %q holds %q", ref, r)
		}
	}
	if strings.HasPrefix(ref, "-") || strings.HasPrefix(ref, "/") || strings.Contains(ref, "//") || strings.HasSuffix(ref, ":") || strings.HasSuffix(ref, "/") {
		return fmt.Errorf("image reference %q is malformed", ref)
	}
	return nil
}

func decodeSecrets(n *yaml.Node, field string) ([]SecretInjection, error) {
	var out []SecretInjection
	err := mapping(n, field, []string{"inject"}, func(key string, v *yaml.Node) error {
		name := join(field, key)
		return sequence(v, name, func(i int, e *yaml.Node) error {
			en := fmt.Sprintf("%s[%d]", name, i)
			var in SecretInjection
			got := map[string]bool{}
			err := mapping(e, en, []string{"env", "hosts"}, func(k string, v *yaml.Node) error {
				got[k] = true
				kn := join(en, k)
				switch k {
				case "env":
					s, err := scalarString(v, kn)
					if err != nil {
						return err
					}
					in.Env = s
				case "hosts":
					return sequence(v, kn, func(j int, h *yaml.Node) error {
						s, err := scalarString(h, fmt.Sprintf("%s[%d]", kn, j))
						if err != nil {
							return err
						}
						in.Hosts = append(in.Hosts, s)
						return nil
					})
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, k := range []string{"env", "hosts"} {
				if !got[k] {
					return fieldErr(e, join(en, k), "missing")
				}
			}
			if err := in.Validate(); err != nil {
				return fieldErr(e, en, "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
			}
			out = append(out, in)
			return nil
		})
	})
	return out, err
}

func actionNames() []string {
	var names []string
	for _, a := range Actions() {
		names = append(names, a.String())
	}
	return names
}

func decision(n *yaml.Node, field string) (Decision, error) {
	s, err := scalarString(n, field)
	if err != nil {
		return "", err
	}
	d, err := ParseDecision(s)
	if err != nil {
		return "", fieldErr(n, field, "unknown decision %q (want allow, deny or ask)", s)
	}
	return d, nil
}

func decodeRule(n *yaml.Node, field string) (Rule, error) {
	var r Rule
	got := map[string]bool{}
	err := mapping(n, field, []string{"action", "target", "decision"}, func(key string, v *yaml.Node) error {
		got[key] = true
		name := join(field, key)
		switch key {
		case "action":
			s, err := scalarString(v, name)
			if err != nil {
				return err
			}
			a, err := ParseAction(s)
			if err != nil {
				return fieldErr(v, name, "unknown action %q (want one of %s)", s, strings.Join(actionNames(), ", "))
			}
			r.Action = a
		case "target":
			s, err := scalarString(v, name)
			if err != nil {
				return err
			}
			if err := ValidGlob(s); err != nil {
				return fieldErr(v, name, "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
			}
			r.Target = s
		case "decision":
			d, err := decision(v, name)
			if err != nil {
				return err
			}
			r.Decision = d
		}
		return nil
	})
	if err != nil {
		return Rule{}, err
	}
	for _, k := range []string{"action", "target", "decision"} {
		if !got[k] {
			return Rule{}, fieldErr(n, join(field, k), "missing")
		}
	}
	return r, nil
}

func decodeNetwork(n *yaml.Node, field string) (NetworkPolicy, error) {
	var np NetworkPolicy
	strs := func(v *yaml.Node, name string, check func(string) error) ([]string, error) {
		var out []string
		err := sequence(v, name, func(i int, e *yaml.Node) error {
			en := fmt.Sprintf("%s[%d]", name, i)
			s, err := scalarString(e, en)
			if err != nil {
				return err
			}
			if err := check(s); err != nil {
				return fieldErr(e, en, "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
			}
			out = append(out, s)
			return nil
		})
		return out, err
	}
	err := mapping(n, field, []string{"mode", "allow", "hosts", "cidrs", "ports", "expose"}, func(key string, v *yaml.Node) error {
		name := join(field, key)
		var err error
		switch key {
		case "mode":
			var s string
			if s, err = scalarString(v, name); err != nil {
				return err
			}
			np.Mode = NetworkMode(s)
			if !np.Mode.Valid() {
				return fieldErr(v, name, "unknown mode %q (want deny-all, allow-all or allowlist)", s)
			}
		case "allow":
			np.Allow, err = strs(v, name, func(s string) error { _, err := ParseAllowEntry(s); return err })
		case "hosts":
			np.Hosts, err = strs(v, name, validHost)
		case "cidrs":
			np.CIDRs, err = strs(v, name, func(s string) error { _, err := ParseCIDR(s); return err })
		case "ports":
			np.Ports, err = ports(v, name)
		case "expose":
			np.Expose, np.ExposeRanges, err = exposeList(v, name)
		}
		return err
	})
	if err != nil {
		return NetworkPolicy{}, err
	}
	if np.Mode == "" && len(np.Expose)+len(np.ExposeRanges) > 0 && len(np.Allow)+len(np.Hosts)+len(np.CIDRs)+len(np.Ports) == 0 {
		// A section that only exposes ports leaves the way out as an
		// unset policy has it: none.
		np.Mode = NetworkDenyAll
	}
	if err := np.Validate(); err != nil {
		return NetworkPolicy{}, fmt.Errorf("line %d: %s: %w", n.Line, field, err)
	}
	return np, nil
}

// ports decodes a sequence of TCP port numbers.
// exposeList reads network.expose: ports (8000) and ranges of them
// ("3000-3999", quoted or not).
func exposeList(v *yaml.Node, name string) ([]int, []PortRange, error) {
	var (
		ps []int
		rs []PortRange
	)
	err := sequence(v, name, func(i int, e *yaml.Node) error {
		en := fmt.Sprintf("%s[%d]", name, i)
		if e.Kind == yaml.ScalarNode && e.Tag == "!!str" {
			r, err := ParsePortRange(e.Value)
			if err != nil {
				return fieldErr(e, en, "want a port or a range FROM-TO of ports 1-65535, got %q", e.Value)
			}
			rs = append(rs, r)
			return nil
		}
		port, err := scalarInt(e, en)
		if err != nil {
			return err
		}
		if port < 1 || port > 65535 {
			return fieldErr(e, en, "port %d out of range 1-65535", port)
		}
		ps = append(ps, int(port))
		return nil
	})
	return ps, rs, err
}

func ports(v *yaml.Node, name string) ([]int, error) {
	var out []int
	err := sequence(v, name, func(i int, e *yaml.Node) error {
		en := fmt.Sprintf("%s[%d]", name, i)
		port, err := scalarInt(e, en)
		if err != nil {
			return err
		}
		if port < 1 || port > 65535 {
			return fieldErr(e, en, "port %d out of range 1-65535", port)
		}
		out = append(out, int(port))
		return nil
	})
	return out, err
}

func decodeLimits(n *yaml.Node, field string) (ResourceLimits, error) {
	var l ResourceLimits
	var keys []string
	for _, k := range LimitKeys() {
		keys = append(keys, string(k))
	}
	err := mapping(n, field, keys, func(key string, v *yaml.Node) error {
		name := join(field, key)
		var err error
		switch LimitKey(key) {
		case LimitTimeout:
			l.Timeout, err = duration(v, name)
		case LimitMemoryBytes:
			l.MemoryBytes, err = byteSize(v, name)
		case LimitOutputBytes:
			l.OutputBytes, err = byteSize(v, name)
		case LimitFileSizeBytes:
			l.FileSizeBytes, err = byteSize(v, name)
		case LimitDiskBytes:
			l.DiskBytes, err = byteSize(v, name)
		case LimitPids:
			l.Pids, err = scalarInt(v, name)
			if err == nil && l.Pids < 0 {
				err = fieldErr(v, name, "must not be negative")
			}
		case LimitCPUs:
			if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float") {
				return fieldErr(v, name, "want a number")
			}
			l.CPUs, err = strconv.ParseFloat(v.Value, 64)
			if err != nil || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs < 0 {
				return fieldErr(v, name, "want a non-negative number, got %q", v.Value)
			}
		}
		return err
	})
	return l, err
}

// duration accepts a Go duration string ("90s", "5m") or a number of
// seconds, the form the Python configuration used.
func duration(n *yaml.Node, field string) (time.Duration, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, fieldErr(n, field, "want a duration")
	}
	var d time.Duration
	switch n.Tag {
	case "!!int", "!!float":
		secs, err := strconv.ParseFloat(n.Value, 64)
		if err != nil || math.IsNaN(secs) || secs < 0 || secs > float64(math.MaxInt64/int64(time.Second)) {
			return 0, fieldErr(n, field, "want a non-negative number of seconds, got %q", n.Value)
		}
		d = time.Duration(secs * float64(time.Second))
	case "!!str":
		var err error
		d, err = time.ParseDuration(n.Value)
		if err != nil {
			return 0, fieldErr(n, field, "want a duration such as 90s or 5m, got %q", n.Value)
		}
	default:
		return 0, fieldErr(n, field, "want a duration")
	}
	if d < 0 {
		return 0, fieldErr(n, field, "must not be negative")
	}
	return d, nil
}

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// byteSize accepts a number of bytes or a whole number with a unit
// ("512MiB", "2G"; K, M, G and T alone are binary, as in container tools).
func byteSize(n *yaml.Node, field string) (int64, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		v, err := scalarInt(n, field)
		if err == nil && v < 0 {
			err = fieldErr(n, field, "must not be negative")
		}
		return v, err
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return 0, fieldErr(n, field, "want a size in bytes")
	}
	s := strings.TrimSpace(n.Value)
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if err != nil || v < 0 {
			break
		}
		if v > math.MaxInt64/u.mult {
			return 0, fieldErr(n, field, "size %q overflows", n.Value)
		}
		return v * u.mult, nil
	}
	return 0, fieldErr(n, field, "want a size such as 512MiB, got %q", n.Value)
}
