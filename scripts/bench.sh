#!/usr/bin/env bash
# Runs every bench/*.sh script, then the Go benchmarks. Each benchmark
# reports its own ratio against a reference measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/testenv.sh
# The namespace benchmarks compare against bubblewrap; without it they skip.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "bench: installing bubblewrap from apt (the namespace backend's reference)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null || true
fi
# The scripts first: bench/cli.sh compares pulse writing on this disk with
# bwrap writing to a tmpfs, and on ext4 without a journal (this machine
# class's root) creating files is slower for minutes after many were
# deleted — which the Go benchmarks do (BenchmarkCommit50000Files removes
# 50,000 files), slowing pulse's side alone. The Go benchmarks compare
# both of their sides on the same disk.
for s in bench/*.sh; do
  [ -e "$s" ] || continue
  echo "== $s"
  bash "$s"
done
go test -run '^$' -bench "${BENCH:-.}" -benchmem -benchtime "${BENCHTIME:-1s}" ./...
