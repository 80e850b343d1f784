#!/usr/bin/env bash
# Runs the Go benchmarks, then every bench/*.sh script. Each benchmark
# reports its own ratio against a reference measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/testenv.sh
# The namespace benchmarks compare against bubblewrap; without it they skip.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "bench: installing bubblewrap from apt (the namespace backend's reference)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null || true
fi
go test -run '^$' -bench "${BENCH:-.}" -benchmem -benchtime "${BENCHTIME:-1s}" ./...
for s in bench/*.sh; do
  [ -e "$s" ] || continue
  echo "== $s"
  bash "$s"
done
