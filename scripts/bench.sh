#!/usr/bin/env bash
# Runs the Go benchmarks, then every bench/*.sh script. Each benchmark
# reports its own ratio against a reference measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/testenv.sh
go test -run '^$' -bench "${BENCH:-.}" -benchmem -benchtime "${BENCHTIME:-1s}" ./...
for s in bench/*.sh; do
  [ -e "$s" ] || continue
  echo "== $s"
  bash "$s"
done
