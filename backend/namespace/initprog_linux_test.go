package namespace

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// copyFile copies src to dst with mode.
func copyFile(t *testing.T, src, dst string, mode os.FileMode, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		b = edit(b)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil {
		t.Fatal(err)
	}
}

func TestOpenInitProgramTrust(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Getuid())
	good := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "bin")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, InitProgramName)
		copyFile(t, exe, p, 0o755, nil)
		return p
	}
	p := good(t)
	prog, err := openInitProgram(p, uid)
	if err != nil {
		t.Fatalf("a private executable in a private directory refused: %v", err)
	}
	prog.file.Close()

	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, p string)
	}{
		{"group-writable file", func(t *testing.T, p string) { os.Chmod(p, 0o775) }},
		{"world-writable file", func(t *testing.T, p string) { os.Chmod(p, 0o757) }},
		{"not executable", func(t *testing.T, p string) { os.Chmod(p, 0o644) }},
		{"world-writable directory", func(t *testing.T, p string) { os.Chmod(filepath.Dir(p), 0o777) }},
		{"group-writable directory", func(t *testing.T, p string) { os.Chmod(filepath.Dir(p), 0o775) }},
		{"symlink", func(t *testing.T, p string) {
			real := filepath.Join(filepath.Dir(filepath.Dir(p)), "real")
			if err := os.Rename(p, real); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", func(t *testing.T, p string) {
			os.Remove(p)
			os.Mkdir(p, 0o755)
		}},
		{"missing", func(t *testing.T, p string) { os.Remove(p) }},
		{"another owner", func(t *testing.T, p string) {
			if os.Getuid() != 0 {
				t.Skip("chown to another uid needs root")
			}
			if err := os.Chown(p, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := good(t)
			tc.spoil(t, p)
			prog, err := openInitProgram(p, uid)
			if err == nil {
				prog.file.Close()
				t.Fatal("accepted")
			}
			if !errors.Is(err, errNoInitProgram) {
				t.Errorf("error %v is not errNoInitProgram", err)
			}
		})
	}
}

// withInitProgram gives b the program at p as if it had been found beside
// the binary, in state (progFound, progTrial, progTrusted).
func withInitProgram(t *testing.T, b *Backend, p string, state int) {
	t.Helper()
	prog, err := openInitProgram(p, uint32(os.Getuid()))
	if err != nil {
		t.Fatal(err)
	}
	b.progMu.Lock()
	b.progLooked, b.prog, b.progState = true, prog, state
	b.progMu.Unlock()
}

// initCopies writes two copies of the test binary: one as it is (the same
// build) and one whose embedded copy of this package's source differs by
// one byte, as another build's would (its code is the same, so only the
// identity check can tell them apart).
func initCopies(t *testing.T) (same, other string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	same, other = filepath.Join(dir, "same"), filepath.Join(dir, "other")
	copyFile(t, exe, same, 0o755, nil)
	// Joined at run time, so that the test's own code and its embedded
	// source do not hold the marker too.
	marker := []byte(strings.Join([]string{"sources is", "this package's", "own source"}, " "))
	copyFile(t, exe, other, 0o755, func(b []byte) []byte {
		if n := bytes.Count(b, marker); n != 1 {
			t.Fatalf("the comment marking the embedded source occurs %d times in the test binary, want 1", n)
		}
		i := bytes.Index(b, marker)
		b[i] = 'S'
		return b
	})
	return same, other
}

// probeTwiceWith probes two backends in turn, one probe cache and state
// directory between them (the second probe reads what the first
// recorded), each given the init program at prog as found beside the
// binary, and hands each to check with the cache's record after its probe.
func probeTwiceWith(t *testing.T, prog string, check func(i int, b *Backend, rec []byte)) {
	t.Helper()
	cache := filepath.Join(t.TempDir(), "probe")
	state := filepath.Join(t.TempDir(), "state")
	for i := range 2 {
		b, err := New(WithStateDir(state), WithProbeCache(cache))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		withInitProgram(t, b, prog, progFound)
		if err := b.Probe(context.Background()); err != nil {
			t.Skipf("namespace backend unavailable here: %v", err)
		}
		rec, _ := os.ReadFile(cache)
		check(i, b, rec)
	}
}

func TestSeparateInitProgram(t *testing.T) {
	same, other := initCopies(t)
	req := helloRequest
	// runHello runs req in a new workspace and checks that it printed
	// hello.
	runHello := func(t *testing.T, b *Backend) {
		t.Helper()
		res, out, errs := runCmd(t, b, req(t.TempDir()))
		if res.ExitCode != 0 || out != "hello\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", res.ExitCode, out, errs)
		}
	}

	t.Run("same build runs the command", func(t *testing.T) {
		b := newBackend(t)
		withInitProgram(t, b, same, progTrusted)
		for range 2 { // a cold init, then one started ahead
			res, out, errs := runCmd(t, b, req(t.TempDir()))
			if res.ExitCode != 0 || out != "hello\n" {
				t.Fatalf("exit %d, stdout %q, stderr %q", res.ExitCode, out, errs)
			}
		}
		if prog, _ := b.initProg(); prog == nil {
			t.Error("the init program was dropped")
		}
	})

	t.Run("another build refuses to run anything when checked", func(t *testing.T) {
		b := newBackend(t)
		withInitProgram(t, b, other, progTrial)
		var out bytes.Buffer
		r := req(t.TempDir())
		r.Stdout, r.Stderr = &out, io.Discard
		res, err := b.Exec(context.Background(), r)
		if err == nil {
			t.Fatalf("Exec through another build's init succeeded: exit %d, stdout %q", res.ExitCode, out.String())
		}
		if out.Len() != 0 {
			t.Errorf("the command ran: %q", out.String())
		}
	})

	t.Run("probe falls back to this binary and remembers it", func(t *testing.T) {
		probeTwiceWith(t, other, func(i int, b *Backend, rec []byte) {
			if prog, _ := b.initProg(); prog != nil {
				t.Fatalf("probe %d: another build's init program still in use", i)
			}
			if !bytes.Contains(rec, []byte("init refused ")) {
				t.Errorf("probe %d: the record does not say the init program was refused:\n%s", i, rec)
			}
			res, out, _ := runCmd(t, b, req(t.TempDir()))
			if res.ExitCode != 0 || out != "hello\n" {
				t.Fatalf("after the fallback: exit %d, stdout %q", res.ExitCode, out)
			}
		})
	})

	t.Run("probe trusts the same build and the cache remembers", func(t *testing.T) {
		probeTwiceWith(t, same, func(i int, b *Backend, rec []byte) {
			if prog, check := b.initProg(); prog == nil || check {
				t.Fatalf("probe %d: the same build's init program is not trusted (in use: %v)", i, prog != nil)
			}
			if !bytes.Contains(rec, []byte("init use ")) {
				t.Errorf("probe %d: the record does not name the init program:\n%s", i, rec)
			}
		})
	})

	t.Run("an unprobed backend probes before its first Exec and trusts the same build", func(t *testing.T) {
		b := unprobedBackend(t)
		withInitProgram(t, b, same, progFound)
		runHello(t, b)
		wantTrusted(t, b, "after the first Exec")
	})

	t.Run("a probe cut short by the Exec's context leaves the program to a later one", func(t *testing.T) {
		b := unprobedBackend(t)
		withInitProgram(t, b, same, progFound)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := req(t.TempDir())
		r.Stdout, r.Stderr = io.Discard, io.Discard
		if res, err := b.Exec(ctx, r); !errors.Is(err, context.Canceled) {
			t.Fatalf("Exec with a cancelled context: %+v, %v; want an error wrapping context.Canceled", res, err)
		}
		runHello(t, b)
		wantTrusted(t, b, "after a cancelled probe and a later Exec")
	})

	t.Run("an unprobed backend falls back to this binary for another build", func(t *testing.T) {
		b := unprobedBackend(t)
		withInitProgram(t, b, other, progFound)
		runHello(t, b)
		if prog, _ := b.initProg(); prog != nil {
			t.Fatal("another build's init program is in use")
		}
	})

	t.Run("a probe does not pass on an init started before its trial", func(t *testing.T) {
		b := unprobedBackend(t)
		withInitProgram(t, b, other, progFound)
		// Started while the program is only found: this binary is its
		// init. The probe's own request (deny-all network, default
		// limits) could take it.
		b.StartAhead(policy.NetworkPolicy{}, policy.ResourceLimits{})
		b.waitWarm()
		if err := b.Probe(context.Background()); err != nil {
			t.Fatalf("Probe: %v", err)
		}
		if prog, _ := b.initProg(); prog != nil {
			t.Fatal("another build's init program is trusted: the probe ran on an init that was not the program")
		}
	})

	t.Run("never used before a probe ran with it", func(t *testing.T) {
		b := newBackend(t)
		withInitProgram(t, b, other, progFound)
		res, out, errs := runCmd(t, b, req(t.TempDir()))
		if res.ExitCode != 0 || out != "hello\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q: an unprobed init program was run", res.ExitCode, out, errs)
		}
	})
}

// helloRequest writes a file in workspace ws and prints it.
func helloRequest(ws string) *backend.Request {
	return &backend.Request{Workspace: ws, Shell: "echo hello > f; cat f",
		Limits: policy.ResourceLimits{Timeout: 30 * time.Second}}
}

// wantTrusted fails t unless b runs its inits from the init program,
// trusted (not on trial): when says at what point.
func wantTrusted(t *testing.T, b *Backend, when string) {
	t.Helper()
	if prog, check := b.initProg(); prog == nil || check {
		t.Fatalf("%s the same build's init program is not trusted (in use: %v): every init is this binary", when, prog != nil)
	}
}

// unprobedBackend is a backend that was never probed, on a machine where
// the probe of another one passed.
func unprobedBackend(t *testing.T) *Backend {
	t.Helper()
	newBackend(t) // skips where the backend is unavailable
	b, err := New(WithStateDir(filepath.Join(t.TempDir(), "state")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestInitProgramKeepsHardening runs the forbidden-syscall helpers and the
// descriptor check with a separate init program (a copy of this binary,
// the same build): the command gets the same restrictions from it, and
// not the program's own descriptor.
func TestInitProgramKeepsHardening(t *testing.T) {
	same, _ := initCopies(t)
	b, exe := helperBackend(t)
	withInitProgram(t, b, same, progTrusted)
	for _, h := range []string{"mount", "ptrace", "userns", "clone3", "bpf", "keyctl", "caps"} {
		t.Run(h, func(t *testing.T) {
			out := runHelperIn(t, b, exe, h)
			if !strings.HasPrefix(out, "refused:") {
				t.Fatalf("%s was allowed inside the sandbox: %q", h, out)
			}
		})
	}
	res, out, errs := runCmd(t, b, &backend.Request{Workspace: t.TempDir(), Shell: `ls /proc/self/fd | tr '\n' ' '`})
	if res.ExitCode != 0 || out != "0 1 2 3 " {
		t.Errorf("the command's descriptors: %q (exit %d, %s), want 0 1 2 and the one ls reads with", out, res.ExitCode, errs)
	}
	if prog, _ := b.initProg(); prog == nil {
		t.Error("the init program was not used")
	}
}

// An init that cannot even be started (here: an init program the kernel
// will not execute, ENOEXEC, as a sandbox that refuses the clone would
// fail the start too) is an error the probe reports or recovers from,
// never a crash in the start's clean-up.
func TestInitThatCannotStartIsAnError(t *testing.T) {
	bad := filepath.Join(t.TempDir(), InitProgramName)
	if err := os.WriteFile(bad, []byte("\x00not a program\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := New(WithStateDir(filepath.Join(t.TempDir(), "state")), WithoutPrestart())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	withInitProgram(t, b, bad, progTrial)
	p, err := b.startInit(false)
	if err == nil {
		p.discard()
		t.Fatal("an init started from a file the kernel cannot execute")
	}
	if p != nil {
		t.Fatalf("a failed start returned an init: %+v", p)
	}
	// The probe drops the program and falls back to this binary.
	withInitProgram(t, b, bad, progFound)
	if err := b.Probe(context.Background()); err != nil && !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Probe = %v, want success or ErrUnavailable", err)
	}
}
