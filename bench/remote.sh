#!/usr/bin/env bash
# Remote backend cost over loopback: Exec of `true` and 64 MiB of stdout
# through pulse-server (in process, host backend as its local executor)
# against the host backend used directly. Each ratio (x-vs-host) is
# measured within one run, the remote and direct calls interleaved.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench 'ExecTrue' -benchtime "${BENCHTIME:-30x}" -count "${COUNT:-3}" ./backend/remote/ | grep -E '^Benchmark'
go test -run '^$' -bench 'Throughput64MiB' -benchtime "${BENCHTIME_BULK:-2x}" -count "${COUNT:-3}" ./backend/remote/ | grep -E '^Benchmark'
