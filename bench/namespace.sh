#!/usr/bin/env bash
# Namespace backend start-up cost, repeated to show its spread on a shared
# machine: Exec of `true` against bare `bash -c true` and against
# `bwrap --unshare-all --ro-bind / / true`, one at a time (warm: the init
# started ahead; cold: WithoutPrestart) and 16 at once (after one untimed
# batch, which sizes the pool of inits started ahead). Every ratio is
# measured within one run, interleaved with its reference. Then where a
# cold Exec's time goes, step by step (TestStartupPhases).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! out=$(go test -run '^$' -bench 'ExecTrue' -benchtime "${BENCHTIME:-30x}" -count "${COUNT:-3}" ./backend/namespace/ 2>&1); then
  echo "$out"
  exit 1
fi
# The ratios, then anything else the benchmarks said (skips, notes).
grep -E '^Benchmark' <<<"$out" || echo "namespace benchmarks did not run"
grep -vE '^(Benchmark|goos|goarch|pkg|cpu|PASS|ok)' <<<"$out" || true
if ! prof=$(go test -count=1 -run '^TestStartupPhases$' -v ./backend/namespace/ 2>&1); then
  echo "$prof"
  exit 1
fi
grep -vE '^(=== RUN|--- PASS|PASS|ok)' <<<"$prof" || true
