#!/usr/bin/env bash
# pulse-server benchmarks: a whole execution of `true` against bare
# `bash -c true`, and streamed output against a local pipe, each measured
# in the same run and printed as a ratio (x-vs-bash, x-vs-pipe).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench 'BenchmarkSubmitTrue|BenchmarkStreamThroughput' -benchtime "${BENCHTIME:-10x}" ./internal/server
