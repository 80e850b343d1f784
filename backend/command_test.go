package backend

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/policy"
)

func TestCheckCommand(t *testing.T) {
	ok := func() *Request { return &Request{Args: []string{"true"}, Env: map[string]string{"A": "b"}} }
	if err := CheckCommand(ok()); err != nil {
		t.Fatalf("a good request: %v", err)
	}
	if err := CheckCommand(&Request{Shell: "echo hi"}); err != nil {
		t.Fatalf("a good script: %v", err)
	}
	bad := map[string]func(r *Request){
		"both args and shell": func(r *Request) { r.Shell = "echo" },
		"neither":             func(r *Request) { r.Args = nil },
		"empty program":       func(r *Request) { r.Args = []string{""} },
		"NUL in an argument":  func(r *Request) { r.Args = []string{"echo", "a\x00b"} },
		"NUL in the script":   func(r *Request) { r.Args, r.Shell = nil, "echo a\x00b" },
		"empty env name":      func(r *Request) { r.Env[""] = "x" },
		"= in an env name":    func(r *Request) { r.Env["A=B"] = "x" },
		"NUL in an env name":  func(r *Request) { r.Env["A\x00"] = "x" },
		"NUL in an env value": func(r *Request) { r.Env["B"] = "a\x00b" },
		"negative timeout":    func(r *Request) { r.Limits = policy.ResourceLimits{Timeout: -1} },
		"negative cpus":       func(r *Request) { r.Limits = policy.ResourceLimits{CPUs: -0.5} },
		"negative file size":  func(r *Request) { r.Limits = policy.ResourceLimits{FileSizeBytes: -1} },
	}
	for name, spoil := range bad {
		r := ok()
		spoil(r)
		if err := CheckCommand(r); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	if err := CheckCommand(nil); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("nil request: %v, want ErrInvalidRequest", err)
	}
}

// FuzzCheckCommandEnv: environment names and values come from agents; an
// accepted pair must round-trip through NAME=value unchanged.
func FuzzCheckCommandEnv(f *testing.F) {
	f.Add("A", "b")
	f.Add("A=B", "c")
	f.Add("", "x")
	f.Add("X", "a\x00b")
	f.Fuzz(func(t *testing.T, k, v string) {
		err := CheckCommand(&Request{Args: []string{"true"}, Env: map[string]string{k: v}})
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error %v is not ErrInvalidRequest", err)
			}
			return
		}
		kv := k + "=" + v
		gk, gv, _ := strings.Cut(kv, "=")
		if gk != k || gv != v || strings.IndexByte(kv, 0) >= 0 {
			t.Fatalf("accepted %q=%q, which execve would read as %q=%q", k, v, gk, gv)
		}
	})
}

func TestEnviron(t *testing.T) {
	base := map[string]string{"PATH": "/bin", "HOME": "/h"}
	got := Environ(base, map[string]string{"HOME": "/mine", "A": "1"})
	want := []string{"A=1", "HOME=/mine", "PATH=/bin"}
	if !slices.Equal(got, want) {
		t.Fatalf("Environ = %q, want %q", got, want)
	}
	if base["HOME"] != "/h" {
		t.Fatal("Environ changed its base")
	}
	if got := Environ(nil, nil); len(got) != 0 {
		t.Fatalf("Environ(nil, nil) = %q", got)
	}
}
