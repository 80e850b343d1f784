package backendtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// Named is one backend of RunAcross: its name, for messages, and its
// factory.
type Named struct {
	Name    string
	Factory Factory
}

// The cross-backend cases hold the promise that a session moves between
// backends: one workspace, one pending stack and one cache, with commands
// run on each backend in turn, every command seeing what the ones before
// it wrote, whichever backend ran them.
var acrossCases = []struct {
	name string
	run  func(t *testing.T, envs []*env)
}{
	{"AcrossStack", testAcrossStack},
	{"AcrossCache", testAcrossCache},
}

// RunAcross runs the cross-backend cases against the backends given (at
// least two), each as a subtest of t. A factory that cannot build its
// backend skips, as for Run; opts apply to every backend.
func RunAcross(t *testing.T, backends []Named, opts ...Option) {
	t.Helper()
	if len(backends) < 2 {
		t.Fatal("RunAcross needs two backends or more")
	}
	var names []string
	for _, nb := range backends {
		names = append(names, nb.Name)
	}
	t.Logf("commands on %s in turn", strings.Join(names, ", "))
	for _, c := range acrossCases {
		t.Run(c.name, func(t *testing.T) {
			ws := t.TempDir()
			var envs []*env
			for _, nb := range backends {
				s := &suite{factory: nb.Factory, opts: options{scale: 1, skip: map[string]string{}, allowEnv: map[string]bool{}}}
				for _, o := range opts {
					o(&s.opts)
				}
				e := s.setup(t)
				e.ws, e.name = ws, nb.Name
				envs = append(envs, e)
			}
			c.run(t, envs)
		})
	}
}

// testAcrossStack: each backend in turn runs a command on the stack the
// commands before it left, checks it sees every earlier write (files,
// a removal, a replacement), and adds its own.
func testAcrossStack(t *testing.T, envs []*env) {
	for _, e := range envs {
		if !e.stacks() {
			t.Skipf("%s does not run commands on a pending stack", e.name)
		}
	}
	envs[0].writeFile("base.txt", []byte("workspace\n"))
	envs[0].writeFile("gone.txt", []byte("to be removed\n"))
	st := &stackSim{}
	const rounds = 4
	for i := range rounds * len(envs) {
		e := envs[i%len(envs)]
		st.e = e
		var check strings.Builder
		check.WriteString("set -e; test \"$(cat base.txt)\" = workspace; ")
		for j := range i {
			fmt.Fprintf(&check, "test \"$(cat step%d/out.txt)\" = %s-%d; ", j, envs[j%len(envs)].name, j)
		}
		if i > 0 {
			check.WriteString("test ! -e gone.txt; ")
			fmt.Fprintf(&check, "test \"$(cat shared.txt)\" = %d; ", i-1)
		}
		fmt.Fprintf(&check, "mkdir step%d; echo %s-%d > step%d/out.txt; echo %d > shared.txt; rm -f gone.txt", i, e.name, i, i, i)
		st.run(check.String())
	}
	if _, err := os.Stat(filepath.Join(envs[0].ws, "step0")); err == nil {
		t.Fatal("a command's write reached the workspace; pending writes stay in the stack")
	}
}

// testAcrossCache: a cache filled on one backend is read, changed,
// added to and emptied on every other, and the reverse: one ownership
// model on every box.
//
// Only the backends that mount caches take part (a remote server's box
// cannot see a directory of the client's machine, and says so in
// Capabilities.MountsCaches); the case needs two of them.
func testAcrossCache(t *testing.T, all []*env) {
	var envs []*env
	for _, e := range all {
		if e.caps.MountsCaches {
			envs = append(envs, e)
		}
	}
	if len(envs) < 2 {
		t.Skipf("fewer than two of the backends mount caches (%d)", len(envs))
	}
	host := filepath.Join(t.TempDir(), "cache")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	cache := []backend.Cache{{Name: "across", HostDir: host, Path: "/cache/across"}}
	run := func(e *env, script string) {
		t.Helper()
		var out, errb recorder
		res := e.exec(t.Context(), &backend.Request{Shell: script, Stdout: &out, Stderr: &errb, Caches: cache})
		if res.ExitCode != 0 {
			t.Fatalf("on %s: %q: exit %d\nstdout %q\nstderr %q", e.name, script, res.ExitCode, out.String(), errb.String())
		}
	}
	for i, a := range envs {
		for j, b := range envs {
			if i == j {
				continue
			}
			d := fmt.Sprintf("/cache/across/%s-to-%s", a.name, b.name)
			// What a tool does to its cache: a tree of directories and
			// files with the modes its umask gives, a file made
			// read-only on purpose.
			run(a, fmt.Sprintf("set -e; umask 022; mkdir -p %[1]s/sub/deep; echo one > %[1]s/sub/deep/f; echo ro > %[1]s/ro; chmod 0444 %[1]s/ro", d))
			run(b, fmt.Sprintf("set -e; test \"$(cat %[1]s/sub/deep/f)\" = one; test \"$(cat %[1]s/ro)\" = ro; "+
				"echo two >> %[1]s/sub/deep/f; echo new > %[1]s/sub/deep/g; mkdir %[1]s/sub/more; mv %[1]s/sub/deep/g %[1]s/sub/more/g", d))
			run(a, fmt.Sprintf("set -e; test \"$(cat %[1]s/sub/deep/f)\" = \"$(printf 'one\\ntwo')\"; test \"$(cat %[1]s/sub/more/g)\" = new; echo a > %[1]s/sub/more/g", d))
			run(b, fmt.Sprintf("set -e; rm -rf %[1]s; test ! -e %[1]s", d))
		}
	}
	if ents, err := os.ReadDir(host); err != nil || len(ents) != 0 {
		t.Fatalf("the cache after every backend emptied what it was given: %v %v", ents, err)
	}
}
