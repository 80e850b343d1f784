#!/usr/bin/env bash
# Namespace backend start-up cost, repeated to show its spread on a shared
# machine: Exec of `true` against bare `bash -c true` and against
# `bwrap --unshare-all --ro-bind / / true`, back to back (warm: the init
# for the next Exec started ahead, its start timed with the Exec that
# started it; cold: WithoutPrestart) and 16 at once; then the same through
# sandbox.Execute (BenchmarkSandboxExecuteTrue*). Every ratio is measured
# within one run, interleaved with its reference, and nothing on the
# measured side is prepared in an untimed wait. The back-to-back ones again
# with cmd/pulse-runtime as the init. Then where a cold Exec's time
# goes, step by step (TestStartupPhases).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! out=$(go test -run '^$' -bench 'ExecTrue|SandboxExecuteTrue' -benchtime "${BENCHTIME:-30x}" -count "${COUNT:-3}" ./backend/namespace/ 2>&1); then
  echo "$out"
  exit 1
fi
# The ratios, then anything else the benchmarks said (skips, notes).
grep -E '^Benchmark' <<<"$out" || echo "namespace benchmarks did not run"
grep -vE '^(Benchmark|goos|goarch|pkg|cpu|PASS|ok)' <<<"$out" || true
# The same back-to-back and parallel ones with cmd/pulse-runtime installed beside
# the (test) binary, as `go build -o bin/ ./cmd/...` installs it beside
# pulse: each init is that small program instead of the test binary again.
# Built as `make build` builds it (CGO_ENABLED=0: static, as bench/cli.sh
# builds its binaries); CGO=1 measures a cgo build, dynamically linked.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/namespace.test" ./backend/namespace/
CGO_ENABLED=${CGO:-0} go build -o "$tmp/" ./cmd/pulse-runtime
# Two runs: a -bench pattern is matched level by level (split at "/"), and
# one that names ExecTrue/warm skips ExecTrueParallel16, a top-level
# benchmark with no "warm" beneath it.
for pat in 'ExecTrue/warm|SandboxExecuteTrue$' 'Parallel16$'; do
  if ! out=$("$tmp/namespace.test" -test.run '^$' -test.bench "$pat" -test.benchtime "${BENCHTIME:-30x}" -test.count "${COUNT:-3}" 2>&1); then
    echo "$out"
    exit 1
  fi
  grep -E '^Benchmark' <<<"$out" | sed 's/^/init program: /' || echo "namespace benchmarks $pat with the init program did not run"
done
if ! prof=$(go test -count=1 -run '^TestStartupPhases$' -v ./backend/namespace/ 2>&1); then
  echo "$prof"
  exit 1
fi
grep -vE '^(=== RUN|--- PASS|PASS|ok)' <<<"$prof" || true
