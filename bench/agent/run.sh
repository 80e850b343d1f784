#!/usr/bin/env bash
# The agent-loop battery (`make bench-agent`; CI runs it with N=1): what an
# agent does in a real repository, through `pulse exec`, each step against
# the same command run directly, in the same run.
#
# The workspace is a clone of this repository at HEAD (one per backend, and
# one for the direct runs). Each step runs through `pulse exec` on every
# backend of BACKENDS (default "namespace docker gvisor bwrap"; Docker with a
# toolchain image that `pulse image build --with git --with go --with
# python3 --with make` makes first) and directly, with the same
# environment, alternately. "bwrap" is a reference, not a backend: the
# same steps under bare bwrap (bwrap_run), what isolating a process costs
# here at the least; skipped where bwrap is not installed.
#
# The steps, in order, each one command:
#   tools        git, go, python3 and make answer --version (on Docker: in
#                the toolchain image)
#   git-status, git-log
#   go-mod       go list -deps of four packages with an empty module cache:
#                every module comes from the local mirror, a GOPROXY
#                directory (this machine's module download cache) served on
#                127.0.0.1 and reached through the allowlist
#                (--allow-host 127.0.0.1:PORT); the mirror's log must show
#                the command's requests
#   go-build, go-test, python3, make, write-2000
#                offline (GOPROXY=off, no network) from the caches
#   edit         the agent adds a function and its test; the workspace
#                stays untouched (a pending transaction)
#   test-edit    go test of the edited package passes only if it sees the
#                edit (the test calls the new function)
#   test-fail    a new test and a wrong function: go test must exit 1
#   fix          a later command fixes the function: go test must exit 0
#   cow-diff     `pulse cow diff` of the whole stack (direct: git diff)
#                must show exactly the expected change
#   commit       `pulse cow commit --all` (direct: nothing to do)
#   git-diff     `git diff` on the host, in the workspace, must be the
#                expected patch byte for byte
# The expected patch is made without running any step: HEAD's two files
# with the added text appended, diffed by git in a clone of its own.
#
# A step passes when its exit status is the one it must have, its output
# (test times and the workspace path taken out) is the direct run's, and
# its own checks hold, on every run. The steps up to write-2000 start from
# a clean workspace each (pulse cow discard --all; the same files removed
# on the direct side); edit..git-diff build on each other, and the
# workspace is reset after git-diff. Resets are untimed on both sides.
#
# Times: without COLD=1 an untimed warm-up runs every step once directly,
# which fills the Go build cache (with -trimpath its entries do not depend
# on the clone's path); each backend's go-build cache starts as a copy of
# it, so every timed run is warm except go-mod, whose module cache is
# emptied before it on every side and every run. Then N runs (default 3)
# of each side, compared by their medians (x-vs-direct, pulse ÷ direct,
# below 1 is faster; over-ms, pulse's median less direct's: what pulse
# adds to a step of a few milliseconds). With COLD=1 nothing is warmed and run 1 is reported
# separately (cold columns). Each step's pair starts after 0.2 s, untimed,
# the think time an agent has between commands: what pulse prepares for
# its next command once one ends (the namespace keeper's next init) is
# made in it, not while a reference is timed.
#
# STEPS="git-status git-log" runs only the steps it names.
#
# Exit status: 0 when every step passed on every backend that ran; 1
# otherwise. A backend that cannot run here is skipped with the reason,
# unless REQUIRE_ALL=1 or PULSE_REQUIRE_DOCKER=1 / PULSE_REQUIRE_NAMESPACE=1 /
# PULSE_REQUIRE_GVISOR=1 (CI) asks for it, where that is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-3}
BACKENDS=${BACKENDS:-"namespace docker gvisor bwrap"}
IMAGE=${IMAGE:-pulse-sandbox-toolchain:agent}
COLD=${COLD:-0}
VERBOSE=${VERBOSE:-0}
repo=$PWD
tmp=$(mktemp -d)
mirror_pid=""
cleanup() {
	if [ -n "$mirror_pid" ]; then kill "$mirror_pid" 2>/dev/null || true; fi
	# The daemons this run started (one per backend's environment).
	for be in $BACKENDS; do
		[ -x "$tmp/pulse" ] && PULSE_CACHE_DIR=$tmp/cache-$be "$tmp/pulse" daemon stop >/dev/null 2>&1 || true
	done
	rm -rf "$tmp" 2>/dev/null || { chmod -R u+w "$tmp"; rm -rf "$tmp"; }
}
trap cleanup EXIT
for prog in git go python3 make; do
	if ! command -v "$prog" >/dev/null; then
		echo "bench/agent: $prog is missing on this machine (the battery runs it directly and brings it into the image)" >&2
		exit 1
	fi
done
# pulse as make build installs it: the thin front end as pulse, the full
# binary beside it as pulse-full, static. Its exec and cow go to the
# user's daemon (the first one starts it; one per backend here, as the
# environment differs), the way an agent's repeated pulse exec calls do;
# PULSE_NO_DAEMON=1 in the environment runs each in a process of its own
# (what the battery measured before the daemon).
CGO_ENABLED=0 go build -o "$tmp/" ./cmd/pulse ./cmd/pulse-runtime
mv "$tmp/pulse" "$tmp/pulse-full"
CGO_ENABLED=0 go build -o "$tmp/pulse" ./internal/daemon/front
pulse=$tmp/pulse
export XDG_CACHE_HOME=$tmp/xdg # the probe cache: the run's own

goroot=$(go env GOROOT)
modcache=$(go env GOMODCACHE)
path=/usr/local/bin:/usr/bin:/bin:$goroot/bin

# The local module mirror: this machine's module download cache is a
# GOPROXY directory; a static file server on 127.0.0.1 serves it, logging
# every request.
cat >"$tmp/mirror.py" <<'EOF'
import functools, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        sys.stderr.write("%s\n" % (fmt % args))
        sys.stderr.flush()
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(H, directory=sys.argv[1]))
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(s.server_address[1]))
import os
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
s.serve_forever()
EOF
python3 "$tmp/mirror.py" "$modcache/cache/download" "$tmp/mirror.port" 2>"$tmp/mirror.log" &
mirror_pid=$!
# Up to a minute: python's start on a loaded 2-core machine is far below
# that, and the bound is only how long a failure takes to say so.
for _ in $(seq 600); do
	[ -s "$tmp/mirror.port" ] && break
	kill -0 "$mirror_pid" 2>/dev/null || break
	sleep 0.1
done
if [ ! -s "$tmp/mirror.port" ]; then
	echo "bench/agent: the module mirror did not start:" >&2
	cat "$tmp/mirror.log" >&2
	exit 1
fi
port=$(cat "$tmp/mirror.port")
mirror=http://127.0.0.1:$port

# The same variables on every side; GOMODCACHE and GOCACHE come from the
# caches on the sandbox side. GOPROXY=off except in go-mod.
vars=("GOFLAGS=-mod=mod -trimpath" GOPROXY=off GOTOOLCHAIN=local GOSUMDB=off GOTELEMETRY=off CGO_ENABLED=0 "PATH=$path" HOME=/tmp LANG=C.UTF-8)

# --no-hardlinks: a clone sharing the repository's object files would
# see their times change whenever git in the repository freshens an
# object, and the Docker side would rightly send them again.
clone() {
	git clone -q --no-hardlinks "$repo" "$1"
	# .pulse/ (the review state) is no part of the project.
	echo .pulse/ >>"$1/.git/info/exclude"
	git -C "$1" config user.email agent@example.com
	git -C "$1" config user.name agent
}
# All clones now, of one HEAD.
clone "$tmp/direct"
clone "$tmp/expect"
for be in $BACKENDS; do clone "$tmp/ws-$be"; done
mkdir -p "$tmp/direct-cache/go-build" "$tmp/direct-cache/go-mod"
# The Docker container holds the workspace twice (its base and the
# command's copy, both in memory) besides what go build needs.
cat >"$tmp/policy.yaml" <<'EOF'
version: 1
limits: {memory_bytes: 4GiB, timeout: 10m}
caches:
  - {name: go-mod, env: GOMODCACHE}
  - {name: go-build, env: GOCACHE}
EOF

# What the agent adds: a function and its test (edit), a wrong function
# and a test that catches it (test-fail), the function fixed (fix).
pkg=lifecycle
src=$pkg/lifecycle.go
tst=$pkg/lifecycle_test.go
add_src1=$'\n// agentDouble is the battery\'s edit.\nfunc agentDouble(n int) int { return n * 2 }\n'
add_tst1=$'\nfunc TestAgentDouble(t *testing.T) {\n\tif got := agentDouble(21); got != 42 {\n\t\tt.Fatalf("agentDouble(21) = %d, want 42", got)\n\t}\n}\n'
add_src2_wrong=$'\n// agentHalf is the battery\'s failing edit, fixed later.\nfunc agentHalf(n int) int { return n * 2 }\n'
add_src2_fixed=$'\n// agentHalf is the battery\'s failing edit, fixed later.\nfunc agentHalf(n int) int { return n / 2 }\n'
add_tst2=$'\nfunc TestAgentHalf(t *testing.T) {\n\tif got := agentHalf(42); got != 21 {\n\t\tt.Fatalf("agentHalf(42) = %d, want 21", got)\n\t}\n}\n'
# The expected patch, made without running a step.
{ git -C "$tmp/expect" show "HEAD:$src" && printf '%s' "$add_src1" "$add_src2_fixed"; } >"$tmp/expect/$src"
{ git -C "$tmp/expect" show "HEAD:$tst" && printf '%s' "$add_tst1" "$add_tst2"; } >"$tmp/expect/$tst"
git -C "$tmp/expect" diff >"$tmp/expected.patch"
printf ' M %s\n M %s\n' "$src" "$tst" >"$tmp/expected.status"
# appender FILE TEXT: a shell command that appends TEXT to FILE (the
# command's last newline is left to the caller).
appender() { printf "cat >>%s <<'PULSE_EOF'\n%sPULSE_EOF\n" "$1" "$2"; }
gotest="go test -count=1 -v -run '^TestAgent' ./$pkg/"

# The steps: NAME<TAB>KIND<TAB>WANT-EXIT<TAB>SCRIPT (bash -c in the
# workspace root; \n in SCRIPT is a newline). KIND: alone (reset after),
# mirror (alone, module cache emptied before, through the allowlist), loop
# (builds on the step before), host (run by the harness on the host).
esc() { printf '%s' "$1" | awk 'BEGIN {ORS = ""} NR > 1 {print "\\n"} {gsub(/\\/, "\\\\"); gsub(/\t/, "\\t"); print}'; }
steps=$(
	cat <<'EOF'
tools	alone	0	git --version && go version && python3 --version && make --version | head -n 1
git-status	alone	0	git status --porcelain=v1 --branch
git-log	alone	0	git log -3 --format='%H %s'
go-mod	mirror	0	go list -deps -test ./pathguard/ ./policy/ ./cowfs/ ./lifecycle/ | sort | sha256sum
go-build	alone	0	go build -o /dev/null ./pathguard/ ./policy/ ./cowfs/ && echo built
go-test	alone	0	go test -count=1 ./pathguard/
python3	alone	0	python3 -c 'import hashlib, json; print(json.dumps({"go.mod": hashlib.sha256(open("go.mod", "rb").read()).hexdigest()[:16]}))'
make	alone	0	make -s fmt && echo formatted
write-2000	alone	0	mkdir gen && i=0 && while [ $i -lt 2000 ]; do i=$((i + 1)); echo "file $i" >gen/f$i.txt; done && ls gen | wc -l
EOF
	printf 'edit\tloop\t0\t%s\n' "$(esc "$(appender "$src" "$add_src1")"$'\n'"$(appender "$tst" "$add_tst1")")"
	printf 'test-edit\tloop\t0\t%s\n' "$gotest"
	printf 'test-fail\tloop\t1\t%s\n' "$(esc "$(appender "$src" "$add_src2_wrong")"$'\n'"$(appender "$tst" "$add_tst2")"$'\n'"$gotest")"
	printf 'fix\tloop\t0\t%s\n' "$(esc "sed -i 's|func agentHalf(n int) int { return n \\* 2 }|func agentHalf(n int) int { return n / 2 }|' $src && $gotest")"
	printf 'cow-diff\thost\t0\t-\n'
	printf 'commit\thost\t0\t-\n'
	printf 'git-diff\thost\t0\t-\n'
)
# STEPS (names, space-separated) keeps only those steps, in their order:
# the few-millisecond ones with a large N, say, whose difference from
# direct is a few ms where a loaded machine moves every time by tens.
if [ -n "${STEPS:-}" ]; then
	steps=$(awk -F'\t' -v keep=" $STEPS " 'index(keep, " " $1 " ")' <<<"$steps")
	[ -n "$steps" ] || { echo "bench/agent: STEPS=$STEPS names no step" >&2; exit 1; }
fi

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
norm() {
	sed -E -e 's/\t[0-9.]+s$//' -e 's/ \(cached\)//' -e 's/ \([0-9.]+s\)$//' -e "s#$tmp/[a-z-]+#WS#g" "$tmp/out"
}
# hunkless FILE: a diff without what differs between two tools' correct
# diffs of the same change and cannot hide a changed line: git's "index"
# lines (hashes of the two versions) and the text after a hunk's line
# ranges (git's function context).
hunkless() { sed -E -e '/^index [0-9a-f]+\.\.[0-9a-f]+( [0-7]+)?$/d' -e 's/^(@@ -[0-9,]+ \+[0-9,]+ @@).*/\1/' "$1"; }

# runstep SIDE NAME KIND SCRIPT: runs one step on one side (direct, or the
# backend whose sandboxed/pulse_ws are set), its stdout in $tmp/out.
direct_run() {
	local name=$1 kind=$2 script=$3
	case $kind in
	host)
		case $name in
		cow-diff | git-diff) git -C "$tmp/direct" diff ;;
		commit) : ;;
		esac
		;;
	mirror) (cd "$tmp/direct" && env -i "${vars[@]}" GOPROXY="$mirror" GOMODCACHE="$tmp/direct-cache/go-mod" GOCACHE="$tmp/direct-cache/go-build" bash -c "$script") ;;
	*) (cd "$tmp/direct" && env -i "${vars[@]}" GOMODCACHE="$tmp/direct-cache/go-mod" GOCACHE="$tmp/direct-cache/go-build" bash -c "$script") ;;
	esac
}
pulse_run() {
	local name=$1 kind=$2 script=$3
	[ "$be" = bwrap ] && { bwrap_run "$@"; return; }
	case $kind in
	host)
		case $name in
		cow-diff) "$pulse" cow diff --workspace "$ws" ;;
		commit) "$pulse" cow commit --all --workspace "$ws" ;;
		git-diff) git -C "$ws" diff ;;
		esac
		;;
	mirror) "$pulse" exec "${flags[@]}" --policy "$tmp/policy.yaml" --workspace "$ws" "${envflags[@]}" --env GOPROXY="$mirror" --allow-host "127.0.0.1:$port" -- bash -c "$script" ;;
	*) "$pulse" exec "${flags[@]}" --policy "$tmp/policy.yaml" --workspace "$ws" "${envflags[@]}" -- bash -c "$script" ;;
	esac
}
# bwrap_run NAME KIND SCRIPT: the step under bare bwrap, the reference
# side "bwrap" stands for: namespaces, a read-only root and a writable
# workspace, nothing pulse adds (no overlay, no policy, no audit, no
# review; the mirror step shares the network, which bwrap cannot narrow
# to one address). What it costs over direct is what isolating a process
# costs on this machine at the least.
bwrap_run() {
	local name=$1 kind=$2 script=$3 net=(--unshare-net) proxy=()
	case $kind in
	host)
		case $name in
		cow-diff | git-diff) git -C "$ws" diff ;;
		commit) : ;;
		esac
		return
		;;
	mirror) net=() proxy=(GOPROXY="$mirror") ;;
	esac
	bwrap --die-with-parent --unshare-user --unshare-pid --unshare-ipc --unshare-uts "${net[@]}" \
		--ro-bind / / --dev /dev --proc /proc --tmpfs /tmp \
		--bind "$ws" "$ws" --bind "$PULSE_CACHE_DIR" "$PULSE_CACHE_DIR" --chdir "$ws" \
		env -i "${vars[@]}" "${proxy[@]}" GOMODCACHE="$PULSE_CACHE_DIR/go-mod" GOCACHE="$PULSE_CACHE_DIR/go-build" bash -c "$script"
}
# empty DIR: a cache emptied, its top directory kept (the Docker backend
# mounts it; its ACL lets every command's uid write).
empty() { find "$1" -mindepth 1 -maxdepth 1 -exec rm -rf {} +; }
direct_reset() { git -C "$tmp/direct" checkout -q -- . && git -C "$tmp/direct" clean -fdq; }
# direct_prep KIND: what a direct run of a step of KIND starts from (a
# mirror step from an empty module cache), and the mirror log's length
# before it, for the step's check.
direct_prep() {
	[ "$1" = mirror ] && empty "$tmp/direct-cache/go-mod"
	mirror_lines=$(wc -l <"$tmp/mirror.log")
}
pulse_reset() {
	[ "$be" = bwrap ] || "$pulse" cow discard --all --workspace "$ws" </dev/null >/dev/null 2>&1 || true
	git -C "$ws" checkout -q -- . && git -C "$ws" clean -fdq
}

# check SIDE NAME: the step's own checks on SIDE's result; prints what
# failed, nothing when all hold.
check() {
	local side=$1 name=$2
	case $side/$name in
	*/go-mod)
		# The modules came from the mirror, now.
		local n
		n=$(wc -l <"$tmp/mirror.log")
		if [ "$n" -le "$mirror_lines" ]; then echo "no request reached the mirror"; fi
		[ -d "$modcache_now/cache/download" ] || echo "the module cache holds no module"
		mirror_lines=$n
		;;
	pulse/tools | pulse/git-status | pulse/git-log | pulse/go-mod | pulse/go-build | pulse/go-test | pulse/python3 | pulse/make)
		# These change nothing in the workspace; what they stage
		# anyway is reported (not a failure: the step's own result is
		# right, but a reviewer would see it).
		local staged
		staged=$("$pulse" cow diff --workspace "$ws" | sed -n 's|^diff --git a/\([^ ]*\) .*|\1|p' | tr '\n' ' ')
		[ -z "$staged" ] || echo "warn: staged $staged(read-only step)"
		;;
	*/test-edit | */fix)
		grep -q '^--- PASS: TestAgentDouble' "$tmp/out" || echo "TestAgentDouble did not pass"
		;;
	*/test-fail)
		grep -q '^--- FAIL: TestAgentHalf' "$tmp/out" || echo "TestAgentHalf did not fail"
		;;
	pulse/edit)
		# A pending write: the workspace itself is untouched.
		[ -z "$(git -C "$ws" status --porcelain)" ] || echo "the workspace changed before commit: $(git -C "$ws" status --porcelain | tr '\n' ' ')"
		[ "$("$pulse" cow list --json --workspace "$ws" | grep -c '"state": "open"')" -ge 1 ] || echo "no pending transaction"
		;;
	direct/cow-diff | direct/git-diff)
		cmp -s "$tmp/out" "$tmp/expected.patch" || echo "git diff is not the expected patch"
		;;
	pulse/cow-diff)
		cmp -s <(hunkless "$tmp/out") <(hunkless "$tmp/expected.patch") || echo "pulse cow diff is not the expected change"
		[ -z "$(git -C "$ws" status --porcelain)" ] || echo "the workspace changed before commit"
		;;
	pulse/commit)
		local list
		list=$("$pulse" cow list --json --workspace "$ws")
		! grep -q '"state": "open"' <<<"$list" || echo "transactions left open after commit --all"
		grep -q '"state": "committed"' <<<"$list" || echo "no transaction committed"
		;;
	pulse/git-diff)
		cmp -s "$tmp/out" "$tmp/expected.patch" || echo "git diff on the host is not the expected patch"
		[ "$(git -C "$ws" status --porcelain)" = "$(cat "$tmp/expected.status")" ] || echo "git status on the host: $(git -C "$ws" status --porcelain | tr '\n' ' ')"
		;;
	esac
}

start=$SECONDS
if [ "$COLD" != 1 ]; then
	# Warm-up, untimed: every step once directly, which fills the Go
	# build cache (the cold build); every side then starts from it.
	while IFS=$'\t' read -r name kind want script; do
		script=$(printf '%b' "$script")
		[ "$kind" = mirror ] && empty "$tmp/direct-cache/go-mod"
		direct_run "$name" "$kind" "$script" </dev/null >/dev/null 2>&1 || true
		[ "$kind" = alone ] || [ "$kind" = mirror ] && direct_reset
	done <<<"$steps"
	direct_reset
	echo "warm-up (direct, untimed): $((SECONDS - start)) s" >&2
fi

printf '%-11s %-10s %-4s %10s %10s %8s %8s %12s %12s\n' step backend pass direct-ms pulse-ms x-vs-dir over-ms cold-dir-ms cold-pulse-ms
total=0 passed=0 failed=0 warns=""
declare -A ok tp td
for be in $BACKENDS; do
	bestart=$SECONDS
	flags=(--backend "$be")
	why=""
	upper=$(tr a-z A-Z <<<"$be")
	req=${REQUIRE_ALL:-0}
	[ "$(printenv "PULSE_REQUIRE_$upper" || true)" = 1 ] && req=1
	side=pulse
	case $be in
	bwrap)
		# A reference, not a backend: it runs the steps the way direct
		# does, so direct's checks are its own.
		side=direct
		command -v bwrap >/dev/null || why="bwrap is not installed (the bare-bwrap reference; Debian: bubblewrap)"
		;;
	docker)
		old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
		# The programs found on the direct side's PATH, so that both
		# sides run the same ones.
		if ! out=$(PATH=$path "$pulse" image build --tag "$IMAGE" --with git --with go --with python3 --with make 2>&1); then
			why="pulse image build failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
		elif [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null)" ]; then
			# This battery's image of an earlier run, replaced.
			docker image rm "$old" >/dev/null 2>&1 || true
		fi
		flags+=(--image "$IMAGE")
		;;
	esac
	ws=$tmp/ws-$be
	if [ -z "$why" ]; then
		export PULSE_CACHE_DIR=$tmp/cache-$be
		mkdir -p "$PULSE_CACHE_DIR/go-mod"
		if [ "$COLD" != 1 ]; then
			# The direct side's build cache, filled by the warm-up,
			# copied (writable by the sandbox's uids).
			cp -a "$tmp/direct-cache/go-build" "$PULSE_CACHE_DIR/"
			chmod -R a+rwX "$PULSE_CACHE_DIR/go-build"
		else
			mkdir -p "$PULSE_CACHE_DIR/go-build"
		fi
		envflags=()
		for v in "${vars[@]}"; do envflags+=(--env "$v"); done
		if ! probe=$(pulse_run probe alone true 2>&1); then
			why="pulse exec cannot run here: $(tail -n 3 <<<"$probe" | tr '\n' ' ')"
		fi
	fi
	if [ -n "$why" ]; then
		echo "$be: skipped: $why"
		if [ "$req" = 1 ]; then failed=1; fi
		continue
	fi
	first=1
	[ "$COLD" = 1 ] && first=0
	ok=() tp=() td=()
	for i in $(seq "$first" "$N"); do
		while IFS=$'\t' read -r name kind want script; do
			script=$(printf '%b' "$script")
			[ -n "${ok[$name]:-}" ] || ok[$name]=1
			# An agent's think time, untimed: what pulse starts after a
			# command for the next one (the Docker container's copy kept,
			# the namespace keeper's next init) is done before the
			# reference below is timed, not while it runs.
			sleep 0.2
			# direct
			direct_prep "$kind"
			modcache_now=$tmp/direct-cache/go-mod
			read -r t rd < <(us direct_run "$name" "$kind" "$script")
			if [ "$rd" != "$want" ]; then
				# The reference itself failed (a test of this repository
				# that flaked on a busy machine, say): that says nothing of
				# pulse. Its output is shown, and it runs once more from the
				# same state; a second failure fails the step.
				echo "--- $be $name run $i: the direct run exited $rd, must be $want; running it again. Its output (last 20 lines):" >&2
				tail -n 20 "$tmp/out" >&2
				if [ "$kind" = alone ] || [ "$kind" = mirror ]; then direct_reset; fi
				direct_prep "$kind"
				read -r t rd < <(us direct_run "$name" "$kind" "$script")
			fi
			dout=$(norm)
			bad=$(check direct "$name")
			[ "$rd" = "$want" ] || bad="exit $rd, must be $want; $bad"
			[ "$kind" = alone ] || [ "$kind" = mirror ] && direct_reset
			td[$name]+="$t "
			# pulse
			[ "$kind" = mirror ] && empty "$PULSE_CACHE_DIR/go-mod"
			mirror_lines=$(wc -l <"$tmp/mirror.log") modcache_now=$PULSE_CACHE_DIR/go-mod
			read -r t rp < <(us pulse_run "$name" "$kind" "$script")
			pout=$(norm)
			pbad=$(check "$side" "$name")
			w=$(grep '^warn: ' <<<"$pbad" || true)
			pbad=$(grep -v '^warn: ' <<<"$pbad" || true)
			[ -z "$w" ] || warns+="$be $name run $i: ${w#warn: }"$'\n'
			[ "$rp" = "$want" ] || pbad="exit $rp, must be $want; $pbad"
			if [ "$kind" != host ] && [ "$pout" != "$dout" ]; then
				pbad="output differs from the direct run's; $pbad"
			fi
			[ "$kind" = alone ] || [ "$kind" = mirror ] && pulse_reset
			tp[$name]+="$t "
			if [ -n "$bad$pbad" ]; then
				ok[$name]=0
				echo "--- $be $name run $i: direct: ${bad:-ok}; pulse: ${pbad:-ok}" >&2
				if [ "$VERBOSE" = 1 ]; then
					echo "--- direct output:" >&2
					echo "$dout" >&2
					echo "--- pulse output:" >&2
					echo "$pout" >&2
					echo "--- pulse stderr:" >&2
					cat "$tmp/err" >&2
				else
					# Always the end of pulse's output and stderr: a
					# failure in CI has to say why without a second run.
					echo "--- pulse output (last 20 lines; VERBOSE=1 for all and the direct run's):" >&2
					tail -n 20 <<<"$pout" >&2
					echo "--- pulse stderr (last 20 lines):" >&2
					tail -n 20 "$tmp/err" >&2
				fi
			fi
		done <<<"$steps"
		direct_reset
		pulse_reset
	done
	while IFS=$'\t' read -r name kind want script; do
		# shellcheck disable=SC2206
		a=(${tp[$name]}) b=(${td[$name]})
		cp0=0 cd0=0
		if [ "$first" = 0 ]; then
			cp0=${a[0]} cd0=${b[0]}
			a=("${a[@]:1}") b=("${b[@]:1}")
		fi
		total=$((total + 1))
		m=no
		if [ "${ok[$name]}" = 1 ]; then m=yes passed=$((passed + 1)); fi
		p=$(median "${a[@]}") d=$(median "${b[@]}")
		[ "$name" = commit ] && d=0 cd0=0
		awk -v s="$name" -v be="$be" -v m="$m" -v p="$p" -v d="$d" -v cd="$cd0" -v cp="$cp0" \
			'BEGIN {c1 = cd ? sprintf("%.1f", cd/1e3) : "-"; c2 = cp ? sprintf("%.1f", cp/1e3) : "-"
			dd = d ? sprintf("%.1f", d/1e3) : "-"; r = d ? sprintf("%.2f", p/d) : "-"
			o = d ? sprintf("%+.1f", (p-d)/1e3) : "-"
			printf "%-11s %-10s %-4s %10s %10.1f %8s %8s %12s %12s\n", s, be, m, dd, p/1e3, r, o, c1, c2}'
	done <<<"$steps"
	echo "$be: $((SECONDS - bestart)) s (image build and resets included)" >&2
done
[ -z "$warns" ] || printf 'warnings (not failures):\n%s' "$warns"
echo "$passed of $total steps passed in $((SECONDS - start)) s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$passed" = "$total" ] && [ "$failed" = 0 ] && [ "$total" -gt 0 ]
