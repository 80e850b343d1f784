package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestExecEnvAndCwd(t *testing.T) {
	ws := t.TempDir()
	must(t, os.Mkdir(filepath.Join(ws, "sub"), 0o755))
	code, stdout, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "host", "--unsafe-host=network,secrets", "--json",
		"--env", "GREETING=hi there", "--env", "EMPTY=", "--cwd", "sub", "--", "sh", "-c", `echo "$GREETING|${EMPTY-unset}|$(basename "$PWD")"`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Stdout     string  `json:"stdout"`
		DurationMS float64 `json:"duration_ms"`
		Metrics    struct {
			UserCPUMS *float64 `json:"user_cpu_ms"`
		} `json:"metrics"`
	}
	must(t, json.Unmarshal([]byte(stdout), &res))
	if res.Stdout != "hi there||sub\n" {
		t.Errorf("stdout = %q, want %q", res.Stdout, "hi there||sub\n")
	}
	if res.DurationMS <= 0 || res.Metrics.UserCPUMS == nil {
		t.Errorf("durations are not milliseconds fields: %s", stdout)
	}
	for _, bad := range [][]string{{"--env", "NOEQUALS"}, {"--env", "=v"}} {
		args := append([]string{"exec", "--workspace", ws, "--backend", "host", "--unsafe-host=network,secrets"}, bad...)
		if code, _, _ := runCLI(t, append(args, "--", "true")...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", bad, code, exitUsage)
		}
	}
	if code, _, _ := runCLI(t, "exec", "--workspace", ws, "--backend", "host", "--unsafe-host=network,secrets", "--cwd", "../..", "--", "true"); code != exitSandbox {
		t.Errorf("--cwd outside the workspace: exit %d, want %d", code, exitSandbox)
	}
}

func TestExecMaxOutputBytesCapsTheOutput(t *testing.T) {
	code, stdout, stderr := runCLI(t, "exec", "--workspace", t.TempDir(), "--backend", "host", "--unsafe-host=network,secrets", "--json",
		"--max-output-bytes", "2048", "--", "sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x")
	if code == exitSandbox {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Stdout    string `json:"stdout"`
		Truncated bool   `json:"truncated"`
	}
	must(t, json.Unmarshal([]byte(stdout), &res))
	if !res.Truncated || len(res.Stdout) > 2048 || len(res.Stdout) == 0 {
		t.Errorf("truncated=%v, %d bytes of stdout; want truncated at 2048", res.Truncated, len(res.Stdout))
	}
	if code, _, _ := runCLI(t, "exec", "--workspace", t.TempDir(), "--max-upload-bytes", "-1", "--", "true"); code != exitUsage {
		t.Errorf("negative --max-upload-bytes: exit %d, want %d", code, exitUsage)
	}
}
