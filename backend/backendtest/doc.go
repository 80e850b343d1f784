// Package backendtest is the conformance suite every backend.Backend
// implementation runs:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) backend.Backend {
//			b, err := mybackend.New()
//			if err != nil {
//				t.Fatal(err)
//			}
//			return b
//		})
//	}
//
// Run calls the factory once per case, so every case gets a fresh backend
// and a fresh workspace (t.TempDir, passed as Request.Workspace). The suite
// closes the backend when the case ends; the factory may register its own
// cleanup too, since Close is idempotent. A factory that cannot build the
// backend here should t.Skip with the reason before returning.
//
// The scripts use only POSIX sh and tools that busybox also provides
// (base64 -d, head -c, yes, env, pwd, sleep with tenths of seconds), so
// that backends whose image holds busybox alone pass too. Every request
// carries the strongest network and secret mode the backend says it
// supports (deny-all when it is supported at all), so that a backend which
// refuses the modes it cannot enforce still runs the suite.
//
// What each case proves:
//
//   - Identity: Name is non-empty, Probe succeeds, Capabilities names a
//     known isolation level and only known enforcement levels.
//   - ExitCodes: exit statuses 0, 3 and 42 come back as ExitCode with
//     Termination Exited, for Shell and for Args requests; a command that
//     kills itself with a signal comes back as Signaled with ExitCode -1.
//   - StdoutStderrSplit: what goes to fd 1 reaches Request.Stdout only and
//     what goes to fd 2 reaches Request.Stderr only, byte-exact.
//   - StdinRoundTrip: 96 KiB holding every byte value, base64-encoded, fed
//     through Request.Stdin to `base64 -d > f`, comes back byte-exact in f
//     (in the overlay, or in place for backends that write in place). The
//     command ends only when it sees EOF, so this also proves Stdin is closed
//     for the command; the reader's Close is called too.
//   - NoStdin: with a nil Stdin, `cat` sees an empty input and ends.
//   - StdinNotRead: a command that never reads an endless Stdin still ends,
//     and the reader is closed (abandoned, as the contract allows).
//   - StreamingOutput: 1 MiB written by a command that then waits for its
//     stdin to close arrives, byte-exact and in several Write calls, before
//     the test closes stdin: output is delivered while the command runs,
//     not buffered until it ends.
//   - TimeoutKillsGroup: a command that starts a background subshell
//     appending to a sentinel file and printing to stdout is stopped by
//     Limits.Timeout: Termination Timeout, TimedOut, ExitCode -1. After Exec
//     returns, nothing more is written to Stdout, and (for backends that
//     write in place) the sentinel stops growing: grandchildren are dead.
//   - CancelKillsGroup: the same, ended by cancelling ctx once the command
//     has printed that it started: Termination Cancelled.
//   - BackgroundEndsWithCommand (backends that write in place): a
//     background process with its output redirected, left behind by a
//     command that exits at once, does not outlive Exec (it would write a
//     file a moment later).
//   - OutputCap: with Limits.OutputBytes set, a finite over-long stdout and
//     stderr are each cut to a prefix of at most the cap and Truncated is
//     set; an endless writer (`yes`) is ended with Termination OutputLimit
//     long before its timeout.
//   - Env: the command's environment holds only the requested variables
//     (values byte-exact, overriding the base) plus the minimal base (PATH,
//     HOME, LANG, TERM, USER, and a few an engine or shell always adds);
//     nothing from the test process's environment leaks in.
//   - Cwd: Dir selects a directory inside the workspace; "" is its root;
//     a Dir that leaves the workspace is refused with ErrInvalidRequest.
//   - InvalidRequest: neither or both of Args and Shell, or an empty argv,
//     are refused with ErrInvalidRequest and no Result.
//   - UnsupportedNetwork: every network mode the backend reports as
//     Unsupported is refused with ErrUnsupported before anything starts.
//   - Concurrent: several Exec calls on one backend at once each get their
//     own output and environment.
//   - Writes (capturing backends): new, changed, deleted, nested and binary
//     files appear in Result.Overlay byte-exact, writes under .pulse/ do
//     not, paths are clean and relative, and the real workspace is left
//     untouched. For backends that write in place, the same script's
//     effects are checked in the workspace itself and Overlay is nil.
//   - OverlayLost (capturing backends; skipped for those that write in
//     place): on a backend built by the WithOverlayLoss factory, which
//     makes it lose what a command writes by a trigger from outside (the
//     backend's conformance run says which, and the case logs it), a
//     command that prints, writes LostFileBytes bytes and exits 3 returns
//     a Result with exit code 3, Termination Exited, its output and no
//     overlay, together with an error wrapping backend.ErrOverlayLost. A
//     capturing backend that gives no WithOverlayLoss fails the case.
//   - HiddenPaths (backends with Capabilities.HidesPaths; skipped for
//     the others): a hidden file and a hidden directory cannot be read or
//     listed, the rest of the workspace can, hiding is reported as no
//     change, and what the command then writes at a hidden path is
//     captured without deleting anything.
//   - StackSeesPending, StackDiscardHides, StackReplaceAcrossSteps,
//     StackLongSession, StackForkIndependent (backends with
//     Capabilities.StacksPending): each
//     command's Overlay becomes the next layer of Request.Pending, as the
//     facade does it. A command sees exactly the workspace now plus the
//     layers given: an earlier command's pending files, directories and
//     symlinks; not a layer taken out (a discard), but a host edit made
//     between commands, unless a layer covers the path. Its overlay is
//     relative to that view (a pending-only file it removes is in
//     Deleted, a pending file it leaves alone is not reported). Modes,
//     renames, rm -r of a directory and a file replaced by a directory
//     and back hold across steps; 200 commands in a row keep stacking.
//     Two stacks that share their bottom layers and then diverge (a
//     forked sandbox) run alternately on one workspace, each command
//     seeing only its own stack. The real workspace is never written.
//   - ReconcileSparesLive: Reconcile succeeds on a fresh backend and, run
//     while an execution is live, leaves it alone: the command finishes,
//     its output and its writes intact.
//   - StartWait, StartKillTree, StartSignal, StartRefused (backends that
//     implement backend.Starter; skipped, saying so, elsewhere): Start
//     returns while the command runs (it waits for input written after
//     Start returned) and Wait returns what Exec would, exit code, output
//     and writes, the same on every call; Signal and Kill after the end
//     give ErrProcessDone and nil. Kill of groupScript returns Cancelled
//     with nothing of the tree left writing, as CancelKillsGroup. A
//     trapped SIGUSR1 sent with Signal ends the command with the trap's
//     exit code (skipped where Signal is ErrUnsupported). A working
//     directory outside the workspace is refused by Start with
//     ErrInvalidRequest.
//   - StartTTY (backends that implement backend.TerminalStarter): with
//     Request.TTY the command's tty is a new /dev/pts/N (of the
//     sandbox's own devpts where it has one) and its controlling
//     terminal, `stty size` says the size asked for, the terminal echoes
//     input and ends lines with \r\n, and Resize reaches the command as
//     SIGWINCH with the new size; Resize after the end is ErrProcessDone.
//   - Close: Close ends a running execution, which still returns a Result
//     (with ErrOverlayLost when Close took its writes with it, as a
//     removed container does), Exec after Close fails with ErrClosed, and
//     a second Close returns nil.
//
// RunAcross runs the cross-backend cases against two backends or more
// (backend/remote runs them on namespace, a pulse-server, Docker and
// gVisor),
// with one workspace:
//   - AcrossStack: the backends take turns, each command on the pending
//     stack the commands before it left on whichever backend; each sees
//     every earlier write, removal and replacement, and the workspace is
//     never written.
//   - AcrossCache: for each ordered pair of the backends that mount
//     caches (Capabilities.MountsCaches), a cache tree made
//     on the first (a file made read-only on purpose included) is read,
//     appended to, added to and renamed in on the second, read and
//     rewritten on the first, and removed whole on the second: one
//     ownership model on every box.
package backendtest
