#!/usr/bin/env bash
# Docker CLI cost, in the same run as each reference, alternately, N
# times each; prints the medians and their ratio (pulse ÷ reference;
# below 1 is faster). Each pulse exec is a new process; the first makes
# the container, and every later one takes over the container the one
# before it left (backend/docker/warm.go), as a CLI-driven agent's
# commands do.
#   BenchmarkDockerCLITrue: `pulse exec --backend docker -- true` against
#     `docker exec` of `true` into a warm container of the same image
#     (x-vs-docker-exec), through the daemon (pulse daemon: the first
#     pulse exec starts it, and every later one hands it its command);
#     BenchmarkDockerCLITrueNoDaemon: the same with PULSE_NO_DAEMON=1,
#     each pulse exec in a process of its own, in the same loop.
#   BenchmarkDockerCLIStdout256MiB: 256 MiB of stdout through `pulse exec
#     --backend docker` into a pipe against `docker exec` of the same
#     command into the warm container, its stdout into a pipe as well
#     (x-vs-docker-exec). NBULK runs (default N/3); BULK=0 skips it.
#   BenchmarkDockerCLIGitStatus: `git status` in a clone of this
#     repository (HEAD, ~5,000 entries with .git) through `pulse exec
#     --backend docker` against `git status` run directly in the same
#     clone (x-vs-direct), with GIT_IMAGE (default: a `pulse image build
#     --with git` image made here). GIT=0 skips it.
#   BenchmarkDockerCLIGitStatusAfterEdit: the same, with a host edit of a
#     tracked file before each run on every side, so that each command's
#     sync has a file to send (as after an edit on the host, or a
#     discarded write).
#   BenchmarkDockerCLIGitStatusAged: the same, once the container's copy
#     of the clone is over a minute old, as the copy of a workspace an
#     agent has worked in for a while is: the end-of-command scan stats
#     only entries changed in the last minute or so (wrapper.sh). AGED=0
#     skips it (it waits 61 s).
# PULSE_B=PATH: a second pulse binary (another build) is timed in the
# same loop, the two taking turns at going first, for an A/B comparison;
# its rows end in /B.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-15}
image=${PULSE_DOCKER_IMAGE:-pulse-sandbox:latest}
command -v docker >/dev/null || { echo "docker-cli: needs the docker CLI for the reference"; exit 1; }
tmp=$(mktemp -d)
cid="" built=""
cleanup() {
	# the daemon of this directory and environment, which holds one
	[ ! -x "$tmp/pulse" ] || "$tmp/pulse" daemon stop
	# the warm containers pulse left for the workspaces under $tmp
	docker ps -a --format '{{.ID}} {{.Label "pulse.warm"}}' | awk -v t="$tmp/" 'index($2, t) == 1 {print $1}' |
		xargs -r docker rm -f >/dev/null
	rm -rf "$tmp"
	[ -z "$cid" ] || docker rm -f "$cid" >/dev/null
	[ -z "$built" ] || docker rmi -f "$built" >/dev/null
}
trap cleanup EXIT
go build -o "$tmp/" ./cmd/pulse ./cmd/pulse-runtime
mkdir "$tmp/ws"
echo hello >"$tmp/ws/README"
cid=$(docker run -d --network none --read-only --user 1000:1000 "$image" /bin/sleep 2147483647)
now() { date +%s%N; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
B=${PULSE_B:-}
report() { # NAME METRIC (pulse_ns, b_ns, ref_ns)
	local name=$1 metric=$2 p d
	d=$(median "${ref_ns[@]}")
	p=$(median "${pulse_ns[@]}")
	row "$name" "$metric" "$p" "$d"
	[ -z "$B" ] || row "$name/B" "$metric" "$(median "${b_ns[@]}")" "$d"
}
row() {
	awk -v name="$1" -v m="$2" -v p="$3" -v d="$4" -v n="$N" -v l="$(cut -d' ' -f1 /proc/loadavg)" \
		'BEGIN {printf "%s\t%d\t%.1f ms/pulse-exec\t%.1f ms/reference\t%.2f %s\t(load %s)\n", name, n, p/1e6, d/1e6, p/d, m, l}'
}
# pulses I ARGS...: times "$tmp/pulse" ARGS (into pulse_ns) and, with
# PULSE_B, $B ARGS (into b_ns), B first on even rounds.
pulses() {
	local i=$1 t0 t1
	shift
	if [ -n "$B" ] && [ $((i % 2)) = 0 ]; then
		t0=$(now); "$B" "$@" >/dev/null 2>&1; t1=$(now); b_ns+=($((t1 - t0)))
	fi
	t0=$(now); "$tmp/pulse" "$@" >/dev/null 2>&1; t1=$(now); pulse_ns+=($((t1 - t0)))
	if [ -n "$B" ] && [ $((i % 2)) = 1 ]; then
		t0=$(now); "$B" "$@" >/dev/null 2>&1; t1=$(now); b_ns+=($((t1 - t0)))
	fi
}
# The first pulse exec makes the container and starts the daemon (the
# one of this directory and environment); the timed ones start once it
# answers.
"$tmp/pulse" exec --backend docker --workspace "$tmp/ws" -- true >/dev/null 2>&1
for _ in $(seq 100); do
	"$tmp/pulse" daemon status | grep -q '^daemon pid' && break
	sleep 0.1
done
pulse_ns=() b_ns=() ref_ns=() nod_ns=()
for i in $(seq "$N"); do
	pulses "$i" exec --backend docker --workspace "$tmp/ws" -- true
	t1=$(now); docker exec "$cid" true; t2=$(now)
	ref_ns+=($((t2 - t1)))
	t1=$(now); PULSE_NO_DAEMON=1 "$tmp/pulse" exec --backend docker --workspace "$tmp/ws" -- true >/dev/null 2>&1; t2=$(now)
	nod_ns+=($((t2 - t1)))
done
report BenchmarkDockerCLITrue x-vs-docker-exec
row BenchmarkDockerCLITrueNoDaemon x-vs-docker-exec "$(median "${nod_ns[@]}")" "$(median "${ref_ns[@]}")"

if [ "${BULK:-1}" = 1 ]; then
	# The default output cap (16 MiB) would cut the stream short.
	printf 'version: 1\nlimits:\n  output_bytes: 512MiB\n' >"$tmp/bulk.yaml"
	big="head -c 268435456 /dev/zero"
	nbulk=${NBULK:-$(((N + 2) / 3))}
	pulse_ns=() b_ns=() ref_ns=()
	for i in $(seq "$nbulk"); do
		for p in "$tmp/pulse" ${B:+"$B"}; do
			t0=$(now); "$p" exec --backend docker --policy "$tmp/bulk.yaml" --workspace "$tmp/ws" -- $big 2>/dev/null | cat >/dev/null; t1=$(now)
			if [ "$p" = "$tmp/pulse" ]; then pulse_ns+=($((t1 - t0))); else b_ns+=($((t1 - t0))); fi
		done
		t0=$(now); docker exec "$cid" $big | cat >/dev/null; t1=$(now)
		ref_ns+=($((t1 - t0)))
	done
	N=$nbulk report BenchmarkDockerCLIStdout256MiB x-vs-docker-exec
fi

[ "${GIT:-1}" = 1 ] || exit 0
git_image=${GIT_IMAGE:-}
if [ -z "$git_image" ]; then
	git_image=pulse-bench-git:$$
	"$tmp/pulse" image build --tag "$git_image" --with git >/dev/null 2>&1 || { echo "docker-cli: pulse image build --with git failed; set GIT_IMAGE or GIT=0"; exit 1; }
	built=$git_image
fi
# Copies, not hard links, of the objects: git freshens (touches) an
# object it writes again, which would change files of the clone whenever
# this repository writes them, and pulse would rightly send them.
git clone -q --no-hardlinks . "$tmp/clone"
# The clone's files age past the racy window (backend/docker/sync.go)
# before the first command, as a workspace does that an agent works in.
sleep 3
ws=$tmp/clone
PULSE_DOCKER_IMAGE=$git_image "$tmp/pulse" exec --backend docker --workspace "$ws" -- git status >/dev/null 2>&1 # makes the container
gitstatus() {
	pulse_ns=() b_ns=() ref_ns=()
	for i in $(seq "$N"); do
		PULSE_DOCKER_IMAGE=$git_image pulses "$i" exec --backend docker --workspace "$ws" -- git status
		t1=$(now); git -C "$ws" status >/dev/null; t2=$(now)
		ref_ns+=($((t2 - t1)))
	done
}
gitstatus
report BenchmarkDockerCLIGitStatus x-vs-direct
# edited I ARGS...: pulses, with a host edit of a tracked file before each
# pulse exec (part of what is timed on neither side), so that every
# command's sync has a file to send, as after an agent's edit on the
# host or a discarded write.
edited() {
	local i=$1 t0 t1
	shift
	if [ -n "$B" ] && [ $((i % 2)) = 0 ]; then
		echo "b $i" >>"$ws/README.md"
		t0=$(now); "$B" "$@" >/dev/null 2>&1; t1=$(now); b_ns+=($((t1 - t0)))
	fi
	echo "a $i" >>"$ws/README.md"
	t0=$(now); "$tmp/pulse" "$@" >/dev/null 2>&1; t1=$(now); pulse_ns+=($((t1 - t0)))
	if [ -n "$B" ] && [ $((i % 2)) = 1 ]; then
		echo "b $i" >>"$ws/README.md"
		t0=$(now); "$B" "$@" >/dev/null 2>&1; t1=$(now); b_ns+=($((t1 - t0)))
	fi
}
pulse_ns=() b_ns=() ref_ns=()
for i in $(seq "$N"); do
	PULSE_DOCKER_IMAGE=$git_image edited "$i" exec --backend docker --workspace "$ws" -- git status
	echo "d $i" >>"$ws/README.md"
	t1=$(now); git -C "$ws" status >/dev/null; t2=$(now)
	ref_ns+=($((t2 - t1)))
done
git -C "$ws" checkout -q README.md
report BenchmarkDockerCLIGitStatusAfterEdit x-vs-direct
[ "${AGED:-1}" = 1 ] || exit 0
# The warm container's idle lifetime is longer than this.
sleep 61
gitstatus
report BenchmarkDockerCLIGitStatusAged x-vs-direct
