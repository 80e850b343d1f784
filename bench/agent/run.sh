#!/usr/bin/env bash
# The agent-loop battery (`make bench-agent`): what an agent does in a real
# repository, through `pulse exec`, each step against the same command run
# directly, in the same run.
#
# The workspace is a clone of this repository at HEAD (one per backend, and
# one for the direct runs). Each step runs through `pulse exec` on every
# backend of BACKENDS (default "namespace docker"; Docker with a toolchain
# image that `pulse image build --with git --with go --with python3 --with
# make` makes first) and directly, with the same environment. A step
# matches when its exit status and its output (timings and the workspace
# path taken out) are the same as the direct run's, on every run. Times:
# the first run of each side is the cold one (empty Go caches: the sandbox
# keeps them in `caches:`, the direct run in a directory of its own); then
# N runs of each side alternately, compared by their medians (x-vs-direct,
# pulse ÷ direct, below 1 is faster). Whatever a step wrote is dropped
# after each run (pulse cow discard --all; the same files removed on the
# direct side), untimed on both sides.
#
# Modules come from this machine's module download cache, copied into
# each side's GOMODCACHE (a local mirror: nothing is fetched, GOPROXY=off;
# go.sum checks every module).
#
# Exit status: 0 when every step matched on every backend that ran; 1
# otherwise. A backend that cannot run here is skipped with the reason,
# unless REQUIRE_ALL=1 (CI), where that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-3}
BACKENDS=${BACKENDS:-"namespace docker"}
IMAGE=${IMAGE:-pulse-sandbox-toolchain:agent}
repo=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" 2>/dev/null || { chmod -R u+w "$tmp"; rm -rf "$tmp"; }' EXIT
go build -o "$tmp/pulse" ./cmd/pulse
pulse=$tmp/pulse
export XDG_CACHE_HOME=$tmp/xdg # the probe cache: the run's own

goroot=$(go env GOROOT)
modcache=$(go env GOMODCACHE)
path=/usr/local/bin:/usr/bin:/bin:$goroot/bin
# The same variables on every side; GOMODCACHE and GOCACHE come from the
# caches on the sandbox side.
vars=(GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOSUMDB=off GOTELEMETRY=off CGO_ENABLED=0 "PATH=$path" HOME=/tmp LANG=C.UTF-8)

clone() {
	git clone -q "$repo" "$1"
	# .pulse/ (the review state) is no part of the project.
	echo .pulse/ >>"$1/.git/info/exclude"
	git -C "$1" config user.email agent@example.com
	git -C "$1" config user.name agent
}
# seed DIR: a module cache holding this machine's downloads, as a local
# mirror does; nothing is extracted yet.
seed() {
	mkdir -p "$1/cache"
	cp -r "$modcache/cache/download" "$1/cache/"
}

# All clones now, of one HEAD.
clone "$tmp/direct"
for be in $BACKENDS; do clone "$tmp/ws-$be"; done
mkdir -p "$tmp/direct-cache/go-build"
seed "$tmp/direct-cache/go-mod"
# The Docker container holds the workspace twice (its base and the
# command's copy, both in memory) besides what go build needs.
cat >"$tmp/policy.yaml" <<'EOF'
version: 1
limits: {memory_bytes: 4GiB, timeout: 10m}
caches:
  - {name: go-mod, env: GOMODCACHE}
  - {name: go-build, env: GOCACHE}
EOF

# The steps: NAME<TAB>SCRIPT, run with bash -c in the workspace root.
steps=$(
	cat <<'EOF'
git-status	git status --porcelain=v1 --branch
git-log	git log -3 --format='%H %s'
go-build	go build -o /dev/null ./pathguard/ ./policy/ ./cowfs/
go-test	go test -count=1 ./pathguard/
python3	python3 -c 'import hashlib, json; print(json.dumps({"go.mod": hashlib.sha256(open("go.mod", "rb").read()).hexdigest()[:16]}))'
make	make -s fmt && echo formatted
write-2000	mkdir gen && i=0 && while [ $i -lt 2000 ]; do i=$((i + 1)); echo "file $i" >gen/f$i.txt; done && ls gen | wc -l
EOF
)

# us CMD...: runs CMD, its stdout into $tmp/out, and prints "MICROSECONDS EXIT".
us() {
	local t0=$EPOCHREALTIME rc=0
	"$@" </dev/null >"$tmp/out" 2>"$tmp/err" || rc=$?
	local t1=$EPOCHREALTIME
	echo "$(((${t1/./} - ${t0/./}))) $rc"
}
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# norm: output with what differs between two correct runs taken out (test
# times, the workspace's path).
norm() { sed -E -e 's/\t[0-9.]+s$//' -e 's/ \(cached\)//' -e "s#$tmp/[a-z-]+#WS#g" "$tmp/out"; }

direct() { (cd "$tmp/direct" && env -i "${vars[@]}" GOMODCACHE="$tmp/direct-cache/go-mod" GOCACHE="$tmp/direct-cache/go-build" bash -c "$1"); }
direct_reset() { rm -rf "$tmp/direct/gen"; }

COLD=${COLD:-0}
if [ "$COLD" != 1 ]; then
	# Warm-up, untimed: every step once directly, which fills the Go
	# caches (the cold build); both sides then start from them.
	while IFS=$'\t' read -r name script; do
		direct "$script" </dev/null >/dev/null 2>&1 || true
		direct_reset
	done <<<"$steps"
fi

printf '%-11s %-10s %-6s %10s %10s %8s %12s %12s\n' step backend match direct-ms pulse-ms x-vs-dir cold-dir-ms cold-pulse-ms
total=0 matched=0 failed=0
for be in $BACKENDS; do
	flags=(--backend "$be")
	why=""
	case $be in
	docker)
		if ! out=$("$pulse" image build --tag "$IMAGE" --with git --with go --with python3 --with make 2>&1); then
			why="pulse image build failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
		fi
		flags+=(--image "$IMAGE")
		;;
	esac
	ws=$tmp/ws-$be
	if [ -z "$why" ]; then
		export PULSE_CACHE_DIR=$tmp/cache-$be
		if [ "$COLD" != 1 ]; then
			# Both sides start from the same warm caches: the direct
			# side's, filled by the warm-up, copied (writable by the
			# sandbox's uids).
			mkdir -p "$PULSE_CACHE_DIR"
			cp -a "$tmp/direct-cache/go-build" "$tmp/direct-cache/go-mod" "$PULSE_CACHE_DIR/"
			chmod -R a+rwX "$PULSE_CACHE_DIR/go-build"
		else
			mkdir -p "$PULSE_CACHE_DIR/go-build"
			seed "$PULSE_CACHE_DIR/go-mod"
		fi
		envflags=()
		for v in "${vars[@]}"; do envflags+=(--env "$v"); done
		sandboxed() { "$pulse" exec "${flags[@]}" --policy "$tmp/policy.yaml" --workspace "$ws" "${envflags[@]}" -- bash -c "$1"; }
		sandbox_reset() { "$pulse" cow discard --all --workspace "$ws" </dev/null >/dev/null 2>&1 || true; }
		if ! probe=$(sandboxed true 2>&1); then
			why="pulse exec cannot run here: $(tail -n 3 <<<"$probe" | tr '\n' ' ')"
		fi
	fi
	if [ -n "$why" ]; then
		echo "$be: skipped: $why"
		if [ "${REQUIRE_ALL:-0}" = 1 ]; then failed=1; fi
		continue
	fi
	first=1
	[ "$COLD" = 1 ] && first=0
	while IFS=$'\t' read -r name script; do
		ok=1 a=() b=() cd0=0 cp0=0
		for i in $(seq "$first" "$N"); do
			read -r td rd < <(us direct "$script")
			want="$rd $(norm)"
			direct_reset
			read -r tp rp < <(us sandboxed "$script")
			got="$rp $(norm)"
			sandbox_reset
			if [ "$got" != "$want" ]; then
				ok=0
				if [ "${VERBOSE:-0}" = 1 ]; then
					echo "--- $be $name run $i: direct: $want" >&2
					echo "--- $be $name run $i: pulse:  $got" >&2
					cat "$tmp/err" >&2
				fi
			fi
			if [ "$i" = 0 ]; then
				cd0=$td cp0=$tp
			else
				a+=("$tp") b+=("$td")
			fi
		done
		total=$((total + 1))
		m=no
		if [ $ok = 1 ]; then m=yes matched=$((matched + 1)); fi
		p=$(median "${a[@]}") d=$(median "${b[@]}")
		awk -v s="$name" -v be="$be" -v m="$m" -v p="$p" -v d="$d" -v cd="$cd0" -v cp="$cp0" \
			'BEGIN {c1 = cd ? sprintf("%.1f", cd/1e3) : "-"; c2 = cp ? sprintf("%.1f", cp/1e3) : "-"
			printf "%-11s %-10s %-6s %10.1f %10.1f %8.2f %12s %12s\n", s, be, m, d/1e3, p/1e3, p/d, c1, c2}'
	done <<<"$steps"
done
echo "$matched of $total steps matched the direct run"
[ "$matched" = "$total" ] && [ "$failed" = 0 ]
