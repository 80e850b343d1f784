#!/usr/bin/env bash
# Namespace backend start-up cost, repeated to show its spread on a shared
# machine: Exec of `true` against bare `bash -c true` and against
# `bwrap --unshare-all --ro-bind / / true`, one at a time (warm: the init
# started ahead; cold: WithoutPrestart) and 16 at once. Every ratio is
# measured within one run, interleaved with its reference.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! out=$(go test -run '^$' -bench 'ExecTrue' -benchtime "${BENCHTIME:-30x}" -count "${COUNT:-3}" ./backend/namespace/ 2>&1); then
  echo "$out"
  exit 1
fi
# The ratios, then anything else the benchmarks said (skips, notes).
grep -E '^Benchmark' <<<"$out" || echo "namespace benchmarks did not run"
grep -vE '^(Benchmark|goos|goarch|pkg|cpu|PASS|ok)' <<<"$out" || true
