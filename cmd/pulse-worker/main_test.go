package main

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker/relaytest"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// staticBinary builds pulse-worker once with CGO_ENABLED=0, the way it
// ships.
func staticBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pulse-worker-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "pulse-worker")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

func TestBuildsStatic(t *testing.T) {
	f, err := elf.Open(staticBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("binary has a dynamic loader (PT_INTERP): not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs shared libraries %v", libs)
	}
}

func TestSIGTERMStopsCleanlyAndKillsRunningCommands(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash on PATH")
	}
	bin := staticBinary(t)
	relay, err := relaytest.Start("tok")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-relay-addr", relay.Addr(), "-sandbox-id", "sbx-sig")
	cmd.Env = append(os.Environ(), "SANDBOX_TOKEN=tok", "WORKER_MAX_CONCURRENT=2")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := relay.Accept(ctx)
	if err != nil {
		t.Fatalf("worker did not attach: %v\n%s", err, stderr.String())
	}
	if h := conn.Hello(); h.GetSandboxId() != "sbx-sig" || h.GetCapacityMax() != 2 {
		t.Errorf("hello = %v: flags and environment not applied", h)
	}
	call, err := conn.Exec(&sandboxv1.Exec{ReqId: 1, Command: "echo $$; sleep 30", Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	first, err := call.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(first.GetChunk().GetData())))
	if err != nil {
		t.Fatalf("first chunk %q: %v", first.GetChunk().GetData(), err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("worker exited with %v after SIGTERM\n%s", err, stderr.String())
		}
	case <-ctx.Done():
		t.Fatalf("worker did not exit after SIGTERM\n%s", stderr.String())
	}
	// The bash leader was the worker's child and has been reaped; a
	// signal to the group finds no one.
	if err := syscall.Kill(-pgid, 0); err == nil {
		t.Errorf("process group %d of the running command survived the worker", pgid)
	}
}

func TestUsageErrors(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	cases := []struct {
		name string
		args []string
		env  func(string) string
		want int
	}{
		{"bad max concurrent in env", nil, env("WORKER_MAX_CONCURRENT", "many"), exitUsage},
		{"bad tls in env", nil, env("RELAY_TLS", "maybe"), exitUsage},
		{"zero max concurrent flag", []string{"-max-concurrent", "0"}, env(), exitUsage},
		{"unknown flag", []string{"-nope"}, env(), exitUsage},
		{"stray argument", []string{"extra"}, env(), exitUsage},
		{"bad log level", []string{"-log-level", "loud"}, env(), exitUsage},
		{"help", []string{"-h"}, env(), exitOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if got := run(t.Context(), tc.args, tc.env, &stderr); got != tc.want {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, tc.want, stderr.String())
			}
		})
	}
}
