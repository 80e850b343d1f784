package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/policy"
)

// TestUnsafeHostEnforcesOrRefuses: WithUnsafeHostExecution is consent to
// running unisolated, not to dropping rules. A rule the host backend
// cannot enforce — the default policy's network and secrets deny-all, an
// allowlist, a memory limit, a read denial — is refused with
// ErrHostCannotEnforce, naming every rule to accept, and the command
// never starts, unless the caller accepted that rule by name.
func TestUnsafeHostEnforcesOrRefuses(t *testing.T) {
	allowNetSecrets := func() *policy.Policy {
		p := policy.Default()
		p.Defaults[policy.Network], p.Defaults[policy.Secrets] = policy.Allow, policy.Allow
		return p
	}
	allowlist := allowNetSecrets()
	allowlist.Network = &policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Hosts: []string{"example.com"}}
	for _, c := range []struct {
		name    string
		opts    []Option
		refused []UnsafeRule // nil: the command runs
		audited []string     // actions audited as accepted by UNSAFE_HOST
	}{
		{"default policy, plain opt-in", nil, []UnsafeRule{UnsafeNetwork, UnsafeSecrets}, nil},
		{"network accepted, secrets not", []Option{WithUnsafeHostExecution(UnsafeNetwork)}, []UnsafeRule{UnsafeSecrets}, nil},
		{"both accepted", []Option{WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets)}, nil, []string{"network", "secrets"}},
		{"accepted over two options", []Option{WithUnsafeHostExecution(UnsafeSecrets), WithUnsafeHostExecution(UnsafeNetwork)}, nil, []string{"network", "secrets"}},
		{"a policy the host enforces", []Option{WithPolicy(allowNetSecrets())}, nil, nil},
		{"an allowlist", []Option{WithPolicy(allowlist)}, []UnsafeRule{UnsafeNetwork}, nil},
		{"an allowlist accepted", []Option{WithPolicy(allowlist), WithUnsafeHostExecution(UnsafeNetwork)}, nil, []string{"network"}},
		{"a memory limit", []Option{WithPolicy(allowNetSecrets()), WithLimits(policy.ResourceLimits{MemoryBytes: 64 << 20})}, []UnsafeRule{UnsafeLimits}, nil},
		{"everything at once", []Option{WithLimits(policy.ResourceLimits{Pids: 64})}, []UnsafeRule{UnsafeNetwork, UnsafeSecrets, UnsafeLimits}, nil},
		{"a read denial", []Option{WithPolicy(readDenyPolicy()), WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets)}, []UnsafeRule{UnsafeReads}, nil},
		{"a read denial accepted", []Option{WithPolicy(readDenyPolicy()), WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets, UnsafeReads)}, nil, []string{"network", "secrets", "read"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ws := secretWorkspace(t)
			opts := append([]Option{withGetenv(noEnv), WithBackendName("host"), WithUnsafeHostExecution()}, c.opts...)
			sb, err := New(context.Background(), ws, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			_, err = sb.Execute(context.Background(), Command{Shell: "echo ran > ran.txt"})
			_, statErr := os.Stat(filepath.Join(ws, "ran.txt"))
			var startErr error
			if c.refused != nil {
				var p *Process
				if p, startErr = sb.Start(context.Background(), Command{Shell: "true"}); p != nil {
					p.Kill()
				}
			}
			evs := verifyAudit(t, sb)
			if c.refused == nil {
				if err != nil || statErr != nil {
					t.Fatalf("refused: %v (ran: %v)", err, statErr)
				}
				for _, a := range c.audited {
					if !hasEvent(evs, func(e audit.Event) bool { return e.Action == a && e.Reason == "UNSAFE_HOST" && e.Decision == "allow" }) {
						t.Errorf("the accepted %s rule is not audited", a)
					}
				}
				return
			}
			var he *HostRuleError
			if !errors.Is(err, ErrHostCannotEnforce) || !errors.Is(err, ErrUnsupportedPolicy) || !errors.As(err, &he) {
				t.Fatalf("err = %v, want ErrHostCannotEnforce", err)
			}
			if !slices.Equal(he.Rules, c.refused) {
				t.Fatalf("rules to accept %v, want %v (%v)", he.Rules, c.refused, err)
			}
			for _, r := range c.refused {
				if !strings.Contains(err.Error(), "sandbox."+constName(r)) || !strings.Contains(err.Error(), "--unsafe-host=") {
					t.Fatalf("the error does not say how to accept %s: %v", r, err)
				}
			}
			if statErr == nil {
				t.Fatal("the refused command ran")
			}
			// A background process is held to the same rules.
			if !errors.Is(startErr, ErrHostCannotEnforce) {
				t.Fatalf("Start: err = %v, want ErrHostCannotEnforce", startErr)
			}
			if !hasEvent(evs, func(e audit.Event) bool { return e.Decision == "deny" && e.Reason == "unsupported_policy" }) {
				t.Fatal("the refusal is not audited")
			}
		})
	}
	if _, err := New(context.Background(), t.TempDir(), WithUnsafeHostExecution("everything")); err == nil {
		t.Fatal("an unknown rule was taken")
	}
}

func TestParseUnsafeRules(t *testing.T) {
	got, err := ParseUnsafeRules("network, secrets,network,,limits")
	if err != nil || !slices.Equal(got, []UnsafeRule{UnsafeNetwork, UnsafeSecrets, UnsafeLimits}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := ParseUnsafeRules("network,all"); err == nil {
		t.Fatal("an unknown rule was taken")
	}
}

// TestUnsafeHostRefusalSuggestsWhatRuns: the refusal's `--unsafe-host=`
// list is one that runs the command. A caller who accepted the network
// and the secrets and is refused for a read denial is told to accept
// reads in addition, not in their place (which would be refused again,
// for the network).
func TestUnsafeHostRefusalSuggestsWhatRuns(t *testing.T) {
	ws := secretWorkspace(t)
	open := func(accept ...UnsafeRule) *Sandbox {
		sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("host"),
			WithPolicy(readDenyPolicy()), WithUnsafeHostExecution(accept...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Close() })
		return sb
	}
	_, err := open(UnsafeNetwork, UnsafeSecrets).Execute(context.Background(), Command{Shell: "true"})
	if !errors.Is(err, ErrHostCannotEnforce) {
		t.Fatalf("err = %v, want ErrHostCannotEnforce", err)
	}
	_, flag, ok := strings.Cut(err.Error(), "--unsafe-host=")
	flag, _, _ = strings.Cut(flag, "`")
	suggested, perr := ParseUnsafeRules(flag)
	if !ok || perr != nil {
		t.Fatalf("no --unsafe-host= list in %v (%v)", err, perr)
	}
	if !strings.Contains(err.Error(), "WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets, sandbox.UnsafeReads)") {
		t.Errorf("the option suggested is not the whole set: %v", err)
	}
	if _, err := open(suggested...).Execute(context.Background(), Command{Shell: "echo ran > ran.txt"}); err != nil {
		t.Fatalf("with the suggested --unsafe-host=%s: %v", flag, err)
	}
}
