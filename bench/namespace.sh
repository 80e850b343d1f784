#!/usr/bin/env bash
# Namespace backend start-up cost, repeated to show its spread on a shared
# machine: Exec of `true` against bare `bash -c true` and against
# `bwrap --unshare-all --ro-bind / / true`, back to back (warm: the init
# for the next Exec started ahead, its start timed with the Exec that
# started it; cold: WithoutPrestart) and 16 at once; then the same through
# sandbox.Execute (BenchmarkSandboxExecuteTrue*). Every ratio is measured
# within one run, interleaved with its reference, and nothing on the
# measured side is prepared in an untimed wait. The back-to-back ones again
# with cmd/pulse-namespace-init as the init. Then where a cold Exec's time
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
# The same back-to-back ones with cmd/pulse-namespace-init installed beside
# the (test) binary, as `go build -o bin/ ./cmd/...` installs it beside
# pulse: each init is that small program instead of the test binary again.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/namespace.test" ./backend/namespace/
go build -o "$tmp/" ./cmd/pulse-namespace-init
if ! out=$("$tmp/namespace.test" -test.run '^$' -test.bench 'ExecTrue/warm|SandboxExecuteTrue$' -test.benchtime "${BENCHTIME:-30x}" -test.count "${COUNT:-3}" 2>&1); then
  echo "$out"
  exit 1
fi
grep -E '^Benchmark' <<<"$out" | sed 's/^/init program: /' || echo "namespace benchmarks with the init program did not run"
if ! prof=$(go test -count=1 -run '^TestStartupPhases$' -v ./backend/namespace/ 2>&1); then
  echo "$prof"
  exit 1
fi
grep -vE '^(=== RUN|--- PASS|PASS|ok)' <<<"$prof" || true
