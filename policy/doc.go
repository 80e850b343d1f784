// Package policy decides what an agent may do, how much of the network it
// may reach and how much it may consume.
//
// A Policy is an ordered list of rules (action, target glob, decision) plus
// a default decision per action; the first matching rule wins. It promises
// to fail closed: an unknown action, a missing default or a malformed glob
// evaluates to Deny, and Allowed is true only when an action is allowed for
// every target.
//
// The built-in Default policy:
//
//	read     allow
//	write    ask    (staged in a pending transaction for review)
//	delete   ask    (staged as a deletion for review)
//	shell    allow  (the command runs sandboxed; its writes are staged)
//	git      ask
//	network  deny   (the facade then enforces network deny-all; a policy
//	                 file's network: section in allowlist or allow-all
//	                 mode allows it)
//	secrets  deny   (the facade then passes no secret to commands)
//
// Parse and Load read a policy file (YAML or JSON, strict: unknown keys,
// bad enums, bad globs, bad hosts and negative limits are errors naming the
// line or field). NetworkPolicy and ResourceLimits carry their own Validate
// methods; ResourceLimits.WithDefaults fills in a default timeout and
// output cap so that no command runs unbounded, and ResourceLimits.Tighten
// lets a command lower, never raise, the policy's limits (ErrLimitExceeded).
// A limit is named by a LimitKey (LimitTimeout, LimitMemoryBytes, ...), the
// key a policy file, Capabilities.Limits and LimitError use alike.
//
// EnforcementLevel (Strong, BestEffort, Unsupported) is how strongly a
// backend enforces a network mode, a secret mode or a limit; the facade
// refuses a command whose effective policy is enforced less than Strong
// unless the caller accepted that.
//
// Whatever a policy says, RunsOnHost names the paths (git hooks and
// config) whose contents the person's own git runs on the host: the
// facade never applies them by standing approval.
package policy
