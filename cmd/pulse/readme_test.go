package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// readmeFirstBlock returns the first ```sh block of the README: the
// command a newcomer runs first, in a clone of the repository.
func readmeFirstBlock(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\n```sh\n")
	if !ok {
		t.Fatal("README.md has no ```sh block")
	}
	block, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatal("README.md's first ```sh block does not end")
	}
	return block
}

// TestReadmeFirstBlockRunsAsWritten runs the README's first command block
// with bash, as written, in a copy of examples/demo placed where the
// block expects it. `go run ./cmd/pulse` is this test binary acting as
// pulse (a shell function stands in for the go command, which would
// build the same main): the block must exit 0, print the diff of what the
// command wrote, and leave the workspace untouched.
func TestReadmeFirstBlockRunsAsWritten(t *testing.T) {
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	testenv.MustHaveNamespace(t, nb.Probe)
	nb.Close()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("bash is not installed: %v", err)
	}
	block := readmeFirstBlock(t)
	if !strings.HasPrefix(block, "go run ./cmd/pulse ") {
		t.Fatalf("the README's first block no longer starts with `go run ./cmd/pulse`; update this test with it:\n%s", block)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	demo := filepath.Join(root, "examples", "demo")
	if err := os.MkdirAll(demo, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("../../examples/demo")
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]string{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("../../examples/demo", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		before[e.Name()] = string(data)
		if err := os.WriteFile(filepath.Join(demo, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := `go() {
  if [ "$1" = run ] && [ "$2" = ./cmd/pulse ]; then shift 2; "$PULSE_TEST_BINARY" "$@"; return; fi
  echo "the README runs go $*, which this test does not stand in for" >&2; return 99
}
` + block + "\n"
	cmd := exec.CommandContext(context.Background(), "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), asPulseEnv+"=1", "PULSE_TEST_BINARY="+self,
		"PULSE_KEEP_WARM=0", // nothing stays running after the test
		"XDG_CACHE_HOME="+t.TempDir(), "XDG_RUNTIME_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's first block failed: %v\n%s\n%s", err, block, out)
	}
	for _, want := range []string{"pending transaction", "+hello from the sandbox", "+note"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("its output lacks %q:\n%s", want, out)
		}
	}
	for name, content := range before {
		data, err := os.ReadFile(filepath.Join(demo, name))
		if err != nil || string(data) != content {
			t.Errorf("the block changed the workspace's %s (%v): %q", name, err, data)
		}
	}
	if _, err := os.Stat(filepath.Join(demo, "notes.txt")); err == nil {
		t.Error("notes.txt landed in the workspace; it must stay pending")
	}
}
