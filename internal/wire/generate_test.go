package wire

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates the Go code into a temporary
// directory and compares it with the committed files, so a .proto edit
// without "go generate" fails the suite.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("needs protoc (Debian: protobuf-compiler) to regenerate the code")
	}
	tool := func(name string) string {
		out, err := exec.Command("go", "tool", "-n", name).Output()
		if err != nil {
			t.Skipf("cannot build pinned generator %s: %v", name, err)
		}
		return string(bytes.TrimSpace(out))
	}
	out := t.TempDir()
	cmd := exec.Command("protoc",
		"--plugin=protoc-gen-go="+tool("protoc-gen-go"),
		"--plugin=protoc-gen-go-grpc="+tool("protoc-gen-go-grpc"),
		"--go_out="+out, "--go_opt=paths=source_relative",
		"--go-grpc_out="+out, "--go-grpc_opt=paths=source_relative",
		"sandbox/v1/worker.proto")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	for _, f := range []string{"sandbox/v1/worker.pb.go", "sandbox/v1/worker_grpc.pb.go"} {
		want, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./internal/wire/...", f)
		}
	}
}
