package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Shell is a persistent shell session on a sandbox: each Run is one
// command, run by Execute like any other (its own execution, its own
// pending transaction, reviewed and audited alone), but it starts in the
// working directory and with the exported variables the previous
// command of the session left, as in one interactive shell. A Shell runs
// one command at a time; its methods are safe for concurrent use.
//
// What is kept is the directory and the exported variables, nothing
// else: not unexported shell variables, functions, aliases, options,
// traps or background jobs (each command is its own bash). A command
// that ends by exec'ing another program, or whose output is cut by the
// output cap before its end, leaves the state as it was.
//
// How: the backend runs a wrapper (never seen by the policy, the audit
// log or the transaction's description, which see the command as
// given) that goes to the saved directory, runs the command with eval in
// the same bash, and on exit writes the directory and the exported
// variables that changed behind a random marker on its standard output;
// the marker and what follows are taken out of the output before the
// caller sees it. Not kept: a variable named SHELLOPTS or BASHOPTS (they
// would change how the wrapper itself runs). Values pass the secret scrubber on the way, so a
// variable holding a secret comes back redacted. The sandbox must have
// bash (every Pulse image and the namespace backend's host root do).
type Shell struct {
	sb *Sandbox

	mu    sync.Mutex
	lost  bool              // the last Run's command left no state
	dir   string            // "" the workspace root; relative, or absolute outside the workspace
	env   map[string]string // exported variables set or changed by the session
	unset map[string]bool   // variables the session unset
}

// NewShell starts a shell session on s, in the workspace root with the
// sandbox's environment.
func (s *Sandbox) NewShell() *Shell {
	return &Shell{sb: s, env: map[string]string{}, unset: map[string]bool{}}
}

// ShellState is what a Shell keeps between commands, to carry a session
// from one process to the next (`pulse exec --session`).
type ShellState struct {
	// Dir is relative to the workspace ("" its root), or an absolute
	// path inside the sandbox.
	Dir   string            `json:"dir"`
	Env   map[string]string `json:"env,omitempty"`
	Unset []string          `json:"unset,omitempty"`
}

// State is the session's state now.
func (sh *Shell) State() ShellState {
	set, unset := sh.Env()
	return ShellState{Dir: sh.Dir(), Env: set, Unset: unset}
}

// ResumeShell continues a session from its State. A variable name that
// is not a shell identifier is refused (ErrInvalidCommand): it could not
// have come from a session.
func (s *Sandbox) ResumeShell(st ShellState) (*Shell, error) {
	sh := s.NewShell()
	sh.dir = st.Dir
	for k, v := range st.Env {
		if !shellName.MatchString(k) {
			return nil, fmt.Errorf("%w: shell state: variable name %q", ErrInvalidCommand, k)
		}
		sh.env[k] = v
	}
	for _, k := range st.Unset {
		if !shellName.MatchString(k) {
			return nil, fmt.Errorf("%w: shell state: variable name %q", ErrInvalidCommand, k)
		}
		sh.unset[k] = true
	}
	return sh, nil
}

// Dir is the session's working directory: relative to the workspace
// ("" is its root), or an absolute path inside the sandbox when a
// command went outside the workspace.
func (sh *Shell) Dir() string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.dir
}

// Lost reports whether the last Run's command ran but left no state (it
// exec'd another program, or the output cap cut the state off): the
// session kept the state from before it.
func (sh *Shell) Lost() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.lost
}

// Env is what the session changed in the environment: the exported
// variables set, and the names unset.
func (sh *Shell) Env() (set map[string]string, unset []string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return maps.Clone(sh.env), slices.Sorted(maps.Keys(sh.unset))
}

// Run runs cmd (Shell or Args; Dir and TTY are refused: use cd) in the
// session, as Execute does, and keeps the directory and the exported
// variables it leaves for the next Run. cmd.Env is added for this
// command only, unless the command exports it anew.
func (sh *Shell) Run(ctx context.Context, cmd Command) (*Result, error) {
	switch {
	case cmd.Dir != "":
		return nil, fmt.Errorf("%w: a shell session keeps its own directory; cd in the command instead of Dir", ErrInvalidCommand)
	case cmd.TTY != nil:
		return nil, fmt.Errorf("%w: a shell session runs no terminal", ErrInvalidCommand)
	case (len(cmd.Args) == 0) == (cmd.Shell == ""):
		return nil, fmt.Errorf("%w: exactly one of Args and Shell must be set", ErrInvalidCommand)
	}
	script := cmd.Shell
	if script == "" {
		// The wrapper runs the argv quoted; the policy and the audit log
		// still see it as Execute shows an argv.
		quoted := make([]string, len(cmd.Args))
		for i, a := range cmd.Args {
			quoted[i] = shellQuote(a)
		}
		script = strings.Join(quoted, " ")
	}
	var mark [16]byte
	if _, err := rand.Read(mark[:]); err != nil {
		return nil, fmt.Errorf("sandbox: shell: %w", err)
	}
	marker := "PULSE-SHELL-STATE-" + hex.EncodeToString(mark[:])

	sh.mu.Lock()
	defer sh.mu.Unlock()
	env := maps.Clone(sh.env)
	maps.Copy(env, cmd.Env) // one command's own, over the session's
	cmd.Env = env
	cmd.run = sh.wrapper(marker, script)
	var collected bytes.Buffer
	out := cmd.Stdout
	if out == nil {
		out = &collected
	}
	tw := &trailerWriter{w: out, marker: []byte(marker)}
	cmd.Stdout = tw
	res, err := sh.sb.Execute(ctx, cmd)
	tw.flush()
	if res != nil && out == &collected {
		res.Stdout = collected.String()
	}
	st, ok := parseShellState(tw.trailer.Bytes(), marker, tw.done && !tw.overflow)
	sh.lost = !ok && res != nil
	if ok {
		sh.apply(st)
	} else if res != nil {
		sh.sb.log.Warn("shell session: the command left no state (exec, output cap or a removed EXIT trap); keeping the previous one",
			"execution", res.ExecutionID)
	}
	return res, err
}

// shellState is what a command left: its directory and the exported
// variables it set or unset.
type shellState struct {
	root, pwd string
	set       map[string]string
	unset     []string
}

func (sh *Shell) apply(st shellState) {
	switch {
	case st.pwd == st.root:
		sh.dir = ""
	case strings.HasPrefix(st.pwd, strings.TrimSuffix(st.root, "/")+"/"):
		sh.dir = strings.TrimPrefix(st.pwd, strings.TrimSuffix(st.root, "/")+"/")
	default:
		sh.dir = st.pwd
	}
	for k, v := range st.set {
		sh.env[k] = v
		delete(sh.unset, k)
	}
	for _, k := range st.unset {
		delete(sh.env, k)
		sh.unset[k] = true
	}
}

// shellName is an exported variable's name as the wrapper may unset it.
var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// wrapper is the bash script the backend runs for one command of the
// session. It checks for bash, goes to the saved directory (the
// workspace root when that is gone, saying so), unsets what the session
// unset, notes the exported variables, and sets an EXIT trap that
// writes the state (marker, root, directory, then +NAME=VALUE for each
// exported variable new or changed and -NAME for each one gone, all
// NUL-terminated, then the marker again) to a copy of standard output
// made before the command could redirect it. The command itself runs by
// eval in this shell, so that its cd and export stay.
func (sh *Shell) wrapper(marker, script string) string {
	var b strings.Builder
	b.WriteString(`if [ -z "${BASH_VERSION:-}" ]; then echo "pulse: a shell session needs bash in the sandbox" >&2; exit 127; fi
__pulse_root=$PWD
exec {__pulse_fd}>&1
`)
	for _, n := range slices.Sorted(maps.Keys(sh.unset)) {
		if shellName.MatchString(n) {
			b.WriteString("unset -v " + n + "\n")
		}
	}
	if sh.dir != "" {
		d := sh.dir
		if !strings.HasPrefix(d, "/") {
			d = "$__pulse_root/" + shellQuote(d)
		} else {
			d = shellQuote(d)
		}
		// Every piece of the saved directory is quoted: a directory a
		// command named "$(...)" must not run in this unreviewed script.
		fmt.Fprintf(&b, "cd -- %s 2>/dev/null || printf 'pulse: shell session: %%s is gone; running in the workspace root\\n' %s >&2\n", d, shellQuote(sh.dir))
	}
	b.WriteString(`declare -A __pulse_e0=()
while IFS= read -r __pulse_n; do __pulse_e0[$__pulse_n]=${!__pulse_n}; done < <(compgen -e)
__pulse_save() {
	[[ -n ${__pulse_saved-} ]] && return
	__pulse_saved=1
	set +eu
	local IFS=$' \t\n' n
	local -A now=()
	while IFS= read -r n; do now[$n]=1; done < <(compgen -e)
	{
		printf '%s\0%s\0%s\0' "$__pulse_m" "$__pulse_root" "$PWD"
		for n in "${!now[@]}"; do
			case $n in PWD|OLDPWD|SHLVL|_|SHELLOPTS|BASHOPTS) continue ;; esac
			if [[ ! -v __pulse_e0[$n] || "${__pulse_e0[$n]}" != "${!n}" ]]; then printf '+%s=%s\0' "$n" "${!n}"; fi
		done
		for n in "${!__pulse_e0[@]}"; do
			[[ -v now[$n] ]] || printf -- '-%s\0' "$n"
		done
		printf '%s' "$__pulse_m"
	} >&$__pulse_fd
}
`)
	fmt.Fprintf(&b, "__pulse_m=%s\n", shellQuote(marker))
	// The state is saved when the command ends by itself, and by the
	// EXIT trap when it calls exit (or set -e ends it); an EXIT trap of
	// the command's own still runs, after. Tracing is off first, so
	// that set -x in the command shows none of this.
	const save = "{ __pulse_rc=$?; set +xv; } 2>/dev/null; __pulse_save; exit $__pulse_rc"
	b.WriteString("trap " + shellQuote(save) + " EXIT\n")
	b.WriteString("eval " + shellQuote(script) + "\n")
	b.WriteString(save + "\n")
	return b.String()
}

// parseShellState reads what the wrapper wrote after the marker: root,
// directory and the variables, NUL-terminated, then the marker. ok is
// false when it is not whole.
func parseShellState(trailer []byte, marker string, whole bool) (shellState, bool) {
	if !whole || !bytes.HasSuffix(trailer, []byte(marker)) {
		return shellState{}, false
	}
	fields := strings.Split(string(trailer[:len(trailer)-len(marker)]), "\x00")
	// "" (the NUL after the first marker), root, pwd, entries..., "" (after the last NUL)
	if len(fields) < 4 || fields[0] != "" || fields[len(fields)-1] != "" {
		return shellState{}, false
	}
	st := shellState{root: fields[1], pwd: fields[2], set: map[string]string{}}
	if st.root == "" || !strings.HasPrefix(st.pwd, "/") {
		return shellState{}, false
	}
	for _, f := range fields[3 : len(fields)-1] {
		switch {
		case strings.HasPrefix(f, "+"):
			k, v, ok := strings.Cut(f[1:], "=")
			if !ok || !shellName.MatchString(k) {
				return shellState{}, false
			}
			st.set[k] = v
		case strings.HasPrefix(f, "-") && shellName.MatchString(f[1:]):
			st.unset = append(st.unset, f[1:])
		default:
			return shellState{}, false
		}
	}
	return st, true
}

// shellQuote quotes s for bash as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// maxShellTrailer bounds the state a command may leave (its exported
// variables); a larger one is dropped and the state kept as it was.
const maxShellTrailer = 4 << 20

// trailerWriter passes a command's standard output on to w, except the
// state between the marker and the marker again, which it keeps in
// trailer (the closing marker included); what follows the state (the
// output of an EXIT trap of the command's own) is passed on too. It holds
// back the few bytes at the end of a write that could begin the marker,
// until the next write or flush says whether they do.
type trailerWriter struct {
	w        io.Writer
	marker   []byte
	held     []byte
	found    bool // the first marker was seen: in the state, or past it
	done     bool // the closing marker was seen: passing on again
	overflow bool
	trailer  bytes.Buffer
}

func (t *trailerWriter) Write(p []byte) (int, error) {
	if t.done {
		_, err := t.w.Write(p)
		return len(p), err
	}
	if t.found {
		from := max(t.trailer.Len()-len(t.marker)+1, 0)
		if t.trailer.Len()+len(p) > maxShellTrailer {
			// Too large to be a state: dropped, and the rest passed on.
			t.overflow, t.done = true, true
			_, err := t.w.Write(p)
			return len(p), err
		}
		t.trailer.Write(p)
		if i := bytes.Index(t.trailer.Bytes()[from:], t.marker); i >= 0 {
			end := from + i + len(t.marker)
			rest := append([]byte(nil), t.trailer.Bytes()[end:]...)
			t.trailer.Truncate(end)
			t.done = true
			if len(rest) > 0 {
				if _, err := t.w.Write(rest); err != nil {
					return len(p), err
				}
			}
		}
		return len(p), nil
	}
	data := append(t.held, p...)
	t.held = nil
	if i := bytes.Index(data, t.marker); i >= 0 {
		t.found = true
		if _, err := t.w.Write(data[:i]); err != nil {
			return len(p), err
		}
		_, err := t.Write(data[i+len(t.marker):])
		return len(p), err
	}
	keep := 0
	for k := min(len(t.marker)-1, len(data)); k > 0; k-- {
		if bytes.HasSuffix(data, t.marker[:k]) {
			keep = k
			break
		}
	}
	t.held = append([]byte(nil), data[len(data)-keep:]...)
	if _, err := t.w.Write(data[:len(data)-keep]); err != nil {
		return len(p), err
	}
	return len(p), nil
}

// flush writes what was held back, when no marker followed it.
func (t *trailerWriter) flush() {
	if !t.found && len(t.held) > 0 {
		_, _ = t.w.Write(t.held)
		t.held = nil
	}
}
