#!/usr/bin/env bash
# Docker CLI start-up cost: `pulse exec --backend docker -- true` against
# `docker exec` of `true` into a warm container of the same image, run
# alternately, N times each, in the same run. Prints the medians and
# their ratio (x-vs-docker-exec, pulse ÷ docker exec; below 1 is faster).
# Each pulse exec is a new process; the first makes the container, and
# every later one takes over the container the one before it left
# (backend/docker/warm.go), as a CLI-driven agent's commands do.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-15}
image=${PULSE_DOCKER_IMAGE:-pulse-sandbox:latest}
command -v docker >/dev/null || { echo "docker-cli: needs the docker CLI for the reference"; exit 1; }
tmp=$(mktemp -d)
cid=""
trap 'rm -rf "$tmp"; [ -z "$cid" ] || docker rm -f "$cid" >/dev/null' EXIT
go build -o "$tmp/pulse" ./cmd/pulse
mkdir "$tmp/ws"
echo hello >"$tmp/ws/README"
cid=$(docker run -d --network none --read-only --user 1000:1000 "$image" /bin/sleep 2147483647)
now() { date +%s%N; }
pulse_ns=() docker_ns=()
for i in $(seq "$N"); do
	t0=$(now); "$tmp/pulse" exec --backend docker --workspace "$tmp/ws" -- true >/dev/null 2>&1; t1=$(now)
	docker exec "$cid" true; t2=$(now)
	pulse_ns+=($((t1 - t0))) docker_ns+=($((t2 - t1)))
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
p=$(median "${pulse_ns[@]}") d=$(median "${docker_ns[@]}")
awk -v p="$p" -v d="$d" -v n="$N" 'BEGIN {printf "BenchmarkDockerCLITrue\t%d\t%.1f ms/pulse-exec\t%.1f ms/docker-exec\t%.2f x-vs-docker-exec\n", n, p/1e6, d/1e6, p/d}'
