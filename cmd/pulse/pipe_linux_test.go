package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"golang.org/x/sys/unix"
)

// TestExecGrowsAPipedStdout: when the CLI's stdout is a pipe, pulse exec
// grows its buffer to backend.OutputChunk (the chunk the command's output
// arrives in), and the output still arrives whole.
func TestExecGrowsAPipedStdout(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if sz, err := unix.FcntlInt(pr.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || sz >= backend.OutputChunk {
		t.Skipf("a new pipe already holds %d bytes (%v): nothing to grow", sz, err)
	}
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(pr)
		got <- string(b)
	}()
	var errb strings.Builder
	env := &cliEnv{stdin: strings.NewReader(""), stdout: pw, stderr: &errb, getenv: func(string) string { return "" }, prog: "pulse"}
	code := run(context.Background(), env, []string{"exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets", "--", "echo", "streamed"})
	sz, szErr := unix.FcntlInt(pw.Fd(), unix.F_GETPIPE_SZ, 0)
	pw.Close()
	if out := <-got; code != 0 || out != "streamed\n" {
		t.Fatalf("exit %d, stdout %q: %s", code, out, errb.String())
	}
	if szErr != nil || sz < backend.OutputChunk {
		t.Fatalf("stdout pipe holds %d bytes (%v), want at least %d", sz, szErr, backend.OutputChunk)
	}
}
