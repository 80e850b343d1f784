#!/usr/bin/env bash
# Namespace backend start-up cost, repeated to show its spread on a shared
# machine: Exec of `true` against bare `bash -c true` and against
# `bwrap --unshare-all --ro-bind / / true`, one at a time and 16 at once.
# Every ratio is measured within one run, interleaved with its reference.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench 'ExecTrue' -benchtime "${BENCHTIME:-30x}" -count "${COUNT:-3}" ./backend/namespace/ |
  grep -E '^Benchmark|skip|SKIP' || echo "namespace benchmarks skipped (no user namespaces here?)"
