package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
	"github.com/pulse-agent/pulse/secrets"
)

// sandboxFlags are the flags that choose how a sandbox is opened, shared
// by the commands that open one, so that `pulse mcp` applies policy,
// secrets and backend choice exactly as `pulse exec` does.
type sandboxFlags struct {
	backend    *string
	unsafeHost *unsafeHostFlag
	policyFile *string
	workspace  *string
	secretEnv  stringList
	secretMode *string
	maxUpload  *int64
	maxOutput  *int64
	image      *string
	allowHosts stringList

	// policyDisk is the loaded policy's limits.disk_bytes (0: none), set
	// by options, for what the summary says of the disk bound.
	policyDisk int64
}

func addSandboxFlags(fs *flag.FlagSet) *sandboxFlags {
	f := &sandboxFlags{}
	f.backend = fs.String("backend", "auto", "backend: auto, remote, docker, namespace, gvisor or host")
	f.unsafeHost = addUnsafeHostFlag(fs, "allow running unisolated on the host when nothing isolates; a rule the host cannot enforce is refused unless named: --unsafe-host=network,secrets,reads,limits (any of them)")
	f.policyFile = fs.String("policy", "", "policy file (YAML or JSON); default: the built-in policy")
	f.workspace = fs.String("workspace", ".", "workspace directory")
	fs.Var(&f.secretEnv, "secret-env", "`NAME` of an environment variable holding a secret to scrub (repeatable)")
	f.image = fs.String("image", "", "Docker image to run commands in (present in the engine; nothing is pulled); implies --backend docker")
	f.secretMode = fs.String("secrets", "", "which --secret-env secrets the command may see when the policy allows secrets: deny-all, allow-all or NAME,NAME (default deny-all)")
	f.maxUpload = fs.Int64("max-upload-bytes", 0, "remote backend: largest workspace archive to upload, compressed (default 32 MiB, as the server's default; the server's --max-upload-bytes must allow it too)")
	f.maxOutput = fs.Int64("max-output-bytes", 0, "cap on each of stdout and stderr of a command; may only lower the policy's (default 16 MiB)")
	fs.Var(&f.allowHosts, "allow-host", "let the command reach `HOST[:PORT]` (or *.domain, IP, CIDR[:PORT]; no port means 80 and 443) through the egress proxy, even under a policy that denies the network (repeatable)")
	return f
}

// options turns the flags into sandbox options. Warnings (a --secret-env
// variable that is not set) go to warn.
func (f *sandboxFlags) options(getenv func(string) string, warn func(string)) ([]sandbox.Option, error) {
	opts := []sandbox.Option{sandbox.WithBackendName(*f.backend)}
	if *f.maxUpload < 0 || *f.maxOutput < 0 {
		return nil, errors.New("--max-upload-bytes and --max-output-bytes must not be negative")
	}
	if *f.maxUpload > 0 {
		opts = append(opts, sandbox.WithRemoteOptions(remote.WithWorkspaceLimits(*f.maxUpload, 0, 0)))
	}
	if *f.maxOutput > 0 {
		opts = append(opts, sandbox.WithLimits(policy.ResourceLimits{OutputBytes: *f.maxOutput}))
	}
	if f.unsafeHost.on {
		opts = append(opts, sandbox.WithUnsafeHostExecution(f.unsafeHost.accept...))
	}
	if len(f.allowHosts) > 0 {
		opts = append(opts, sandbox.WithAllowHosts(f.allowHosts...))
	}
	if *f.image != "" {
		opts = append(opts, sandbox.WithImage(*f.image))
	}
	if *f.policyFile != "" {
		p, err := policy.Load(*f.policyFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sandbox.WithPolicy(p))
		f.policyDisk = p.Limits.DiskBytes
	}
	if len(f.secretEnv) > 0 {
		var list []secrets.Secret
		for _, name := range f.secretEnv {
			v := getenv(name)
			if v == "" {
				warn(fmt.Sprintf("--secret-env %s: the variable is not set; nothing to scrub for it", name))
				continue
			}
			list = append(list, secrets.Secret{Name: name, Value: v})
		}
		opts = append(opts, sandbox.WithSecrets(list))
	}
	if *f.secretMode != "" {
		var sp secrets.Policy
		switch *f.secretMode {
		case string(secrets.DenyAll):
			sp = secrets.DenyAllSecrets()
		case string(secrets.AllowAll):
			sp = secrets.AllowAllSecrets()
		default:
			sp = secrets.AllowSecrets(strings.Split(*f.secretMode, ",")...)
		}
		opts = append(opts, sandbox.WithSecretPolicy(sp))
	}
	return opts, nil
}

// unsafeHostFlag is --unsafe-host: alone (a boolean flag) the consent to
// running unisolated; --unsafe-host=network,secrets also accepts that the
// named rules go unenforced (sandbox.UnsafeRule).
type unsafeHostFlag struct {
	on     bool
	accept []sandbox.UnsafeRule
}

func addUnsafeHostFlag(fs *flag.FlagSet, usage string) *unsafeHostFlag {
	f := &unsafeHostFlag{}
	fs.Var(f, "unsafe-host", usage)
	return f
}

func (f *unsafeHostFlag) IsBoolFlag() bool { return true }

func (f *unsafeHostFlag) String() string {
	if f == nil || !f.on {
		return ""
	}
	s := make([]string, len(f.accept))
	for i, r := range f.accept {
		s[i] = string(r)
	}
	return strings.Join(s, ",")
}

func (f *unsafeHostFlag) Set(v string) error {
	if b, err := strconv.ParseBool(v); err == nil {
		f.on = b
		if !b {
			f.accept = nil
		}
		return nil
	}
	rules, err := sandbox.ParseUnsafeRules(v)
	if err != nil {
		return err
	}
	if len(rules) == 0 {
		return fmt.Errorf("want rules to accept (%s), or no value", "network,secrets,reads,limits")
	}
	f.on = true
	for _, r := range rules {
		if !slices.Contains(f.accept, r) {
			f.accept = append(f.accept, r)
		}
	}
	return nil
}

// fleetHint is what to do when a pulse-server relaying to pulse-workers
// refuses the policy.
const fleetHint = "the server relays commands to pulse-workers, and none attached makes boxes (each says why at start), " +
	"so the fleet cannot restrict a command's network or environment; run workers where user namespaces are allowed " +
	"(docs/security.md), or allow network and secrets explicitly: --policy examples/fleet-policy.yaml --secrets allow-all"

// refusalHint says how to get past a refusal of sb's policy, when there
// is something to say ("" otherwise).
func refusalHint(sb *sandbox.Sandbox, err error) string {
	if errors.Is(err, sandbox.ErrPendingInTheWay) {
		return "" // each front end names its own way to the pending stack
	}
	if !errors.Is(err, sandbox.ErrUnsupportedPolicy) {
		return ""
	}
	if r, ok := sb.Backend().(interface{ Executor() string }); ok && r.Executor() == "relay" {
		return fleetHint
	}
	return ""
}
