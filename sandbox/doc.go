// Package sandbox is the facade agent code calls to run commands and
// change files without touching the real workspace until a person or a
// rule approves.
//
//	sb, err := sandbox.New(ctx, "/path/to/repo",
//	    sandbox.WithPolicy(pol), sandbox.WithSecrets(secrets.FromEnv("GITHUB_TOKEN")))
//	defer sb.Close()
//	res, err := sb.Execute(ctx, sandbox.Command{Args: []string{"go", "test", "./..."}, Stdout: os.Stdout})
//	// res.Transaction holds what the command wrote, pending review.
//
// What it promises:
//
//   - Backend selection is explicit and audited: WithBackend, else the
//     first available of remote (PULSE_REMOTE_URL), Docker, Linux
//     namespaces, and — only with WithUnsafeHostExecution — the host.
//     With none, New fails with ErrUnavailable naming what was tried.
//   - Fail closed: before a command starts, the effective network and
//     secret policies are resolved (a policy denying the network or
//     secrets action forces deny-all) and the command is refused with
//     ErrUnsupportedPolicy unless the backend enforces them strongly. The
//     unsafe host backend's opt-in (WithUnsafeHostExecution) is consent to
//     running unisolated, not to dropping rules: a rule the host cannot
//     enforce is refused too (ErrHostCannotEnforce, a *HostRuleError
//     naming each), unless the caller accepted it by name (UnsafeNetwork,
//     UnsafeSecrets, UnsafeReads, UnsafeLimits); each accepted downgrade
//     is audited.
//   - Read denials bind commands: they are expanded against the
//     workspace into Request.Hidden before each command, and a backend
//     without Capabilities.HidesPaths gets no such command
//     (ErrUnsupportedPolicy, audited; on the unsafe host, UnsafeReads
//     accepts it, audited). A hidden path is never deleted by a command.
//   - Every action is checked against the policy (ErrPolicyDenied) and
//     lands in the hash-chained audit log, scrubbed of secrets. A command
//     whose start cannot be audited does not run.
//   - Output reaches the caller only through streaming scrubbers: a secret
//     split across writes is still redacted. Every other string handed
//     back (Result fields, errors, passed-over reasons, transaction
//     descriptions) is scrubbed too.
//   - The policy's resource limits are a ceiling: WithLimits and
//     Command.Limits only tighten them, and asking for more fails with
//     ErrLimitExceeded before anything runs.
//   - Writes never land directly: an isolating backend's overlay is staged
//     byte-exact into a cowfs transaction that stays pending for review
//     (or is committed at once with WithAutoCommit, where conflicts are
//     reported and nothing is overwritten). Staged paths pass the write
//     and delete policy, and content embedding a configured secret is
//     refused. Paths git on the host would run (hooks, config; see
//     policy.RunsOnHost) are never auto-committed: the transaction is held
//     with ErrRunsOnHost for a person.
//   - Commands stack: each runs on the workspace as it is on disk now plus
//     every pending transaction in order (whichever process staged them),
//     and nothing else; its writes become the next transaction. ReadFile
//     reads through the stack (ReadCommittedFile does not); PreviewStack,
//     CommitAll, DiscardAll and Squash work on the whole stack, and
//     committing or discarding one transaction alone is refused with
//     ErrStackDependency while another shares its paths. Past WithMaxStack
//     pending transactions the older ones are squashed into one (audited;
//     the per-command events stay). A damaged transaction is left out of
//     the view and audited. A capturing backend that cannot stack
//     (Capabilities.StacksPending) is refused a non-empty stack.
//   - Fork returns a sandbox whose stack starts as this one's, without
//     copying anything (a lane of the transaction store: see cowfs,
//     "Lanes"); from then on each side's commands see the shared base and
//     their own side's transactions only. A fork's CommitAll commits its
//     whole stack, its DiscardAll only its own transactions; a shared
//     transaction that the other side built on cannot be committed or
//     discarded alone (ErrStackDependency). The fork shares the backend
//     and audit log, released when the last of them is closed; a backend
//     that keeps state between commands keeps it per lane (Docker: a
//     warm container of the fork's own).
//   - A Tx (BeginTx, OpenTx) stages paths under the same checks as a
//     command's writes, and every commit checks each change against the
//     policy again, so a denied path never lands however it was staged.
//   - Start runs a command as Execute does — the same checks, audit events,
//     limits and pending stack, its writes staged when it ends — but
//     returns a Process once it runs: Wait, Signal, Kill (the whole tree;
//     nothing is left running), Stdin, and Output from any byte offset
//     (stdout and stderr as they arrived, scrubbed, kept until Close,
//     bounded by twice output_bytes). A backend without
//     backend.Starter refuses it with ErrUnsupported. Command.TTY runs it
//     on a new terminal made inside the sandbox, never the caller's
//     (Process.Resize), where the backend is a backend.TerminalStarter.
//   - Expose reaches a port a process listens on inside the sandbox from
//     the host's loopback, only for ports the policy lists in
//     network.expose (any network mode); others are refused with an
//     *ExposeError. Both are audited.
//   - List, Stat and ReadFile read through the pending stack; WriteFile
//     stages a transaction of its own under a command's write checks;
//     Watch reports what lands on (or leaves) the stack, by comparing the
//     pending view when inotify says the stack (or the workspace) changed,
//     or every WatchInterval without inotify.
//   - Many Execute calls may run at once on one Sandbox; Close kills the
//     live processes, stops exposing ports and waits for the calls.
//
// Selection picks among the backends the program links: each backend's
// package registers itself with backend.Register when imported, and this
// package imports none. Import backend/all for every backend (what the
// pulse binary does), or only the ones wanted, e.g. backend/namespace
// alone, which links no Docker client. Programs that may pick the
// namespace backend must call namespace.Init() first thing in main (see
// package backend/namespace).
package sandbox
