#!/usr/bin/env bash
# The CLI's cost, one `pulse exec` process at a time, each against a
# reference doing the same work, run alternately in the same loop and
# compared by their medians (pulse ÷ reference, below 1 is faster):
#   - namespace `true` against `bwrap --unshare-all --ro-bind / / true`,
#     back to back, and with 0.3 s between commands (the keeper's case)
#   - host `true` (--unsafe-host=network,secrets) against `bash -c true`, in a fresh
#     workspace and in one with 40 pending transactions, and against
#     itself with PULSE_HUGEPAGES=0 (its heap in small pages)
#   - 256 MiB of stdout through pulse exec (host and namespace) into a pipe,
#     against the same `head -c` writing into that pipe directly
#   - 1,000 files written and committed (--auto-commit, namespace) against
#     bwrap running the same script in a tmpfs, and in a directory of the
#     workspace's disk; then, where /dev/shm is a tmpfs, the same with the
#     backend's state dir (the overlay's upper directory) on that tmpfs
#     (as $XDG_RUNTIME_DIR is on a machine with a login session), and with
#     the workspace there too, against bwrap on a tmpfs: the same file
#     system on both sides, so what is left is pulse's own work
#   - remote `true` (pulse-server on loopback, host executor) against the
#     host CLI: the difference in ms rather than a ratio
#   - through the daemon (pulse daemon: the first pulse exec starts it,
#     each later one hands its command to it), with pulse as make build
#     installs it (the thin front end, internal/daemon/front, the full
#     binary beside it as pulse-full): namespace `true` against bwrap,
#     host `true` against `bash -c true`, 256 MiB of namespace stdout
#     against the direct pipe and 1,000 files written and committed
#     against bwrap on a tmpfs, the in-process rows beside them; and
#     `true` from the full binary itself through the daemon (what `go
#     run ./cmd/pulse` and `go install ./cmd/pulse` give), the
#     BenchmarkCLIFullDaemon rows
# N sets the runs of each pair (default 21; the bulk ones run N/3).
# ROWS=daemon runs only the daemon rows and the in-process rows of the
# same commands; ROWS=stdout only the daemon's 256 MiB stdout row;
# ROWS=true only the two daemon `true` rows (namespace and host).
# BASE=REV (a git revision) adds, in the `true` rows, pulse built from
# REV the same way, run in the same loop: before and after, each against
# the same reference runs.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-21}
NBULK=${NBULK:-$(((N + 2) / 3))}
tmp=$(mktemp -d)
srv=""
trap '[ -z "$srv" ] || kill "$srv" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; echo "load average at end: $(cut -d" " -f1-3 /proc/loadavg)"' EXIT
# pulse-runtime beside pulse is what an install of ./cmd/... has:
# the namespace backend runs it as each sandbox's init. Built as `make
# build` builds them (CGO_ENABLED=0: static, no libc resolver or loader):
# the binaries the project ships. CGO=1 measures a cgo build instead (what
# a plain `go build` makes where a C compiler is found).
CGO_ENABLED=${CGO:-0} go build -o "$tmp/" ./cmd/pulse ./cmd/pulse-runtime ./cmd/pulse-server
# As make build installs them: pulse is the thin front end
# (internal/daemon/front), the full binary beside it is pulse-full. The
# in-process rows run the full binary itself ($pulse), as `go install
# ./cmd/pulse` installs it; the daemon rows run pulse as installed ($inst).
mv "$tmp/pulse" "$tmp/pulse-full"
CGO_ENABLED=${CGO:-0} go build -o "$tmp/pulse" ./internal/daemon/front
if [ -n "${BASE:-}" ]; then
	mkdir "$tmp/basesrc" "$tmp/base"
	git archive "$BASE" | tar -x -C "$tmp/basesrc"
	(cd "$tmp/basesrc" && CGO_ENABLED=${CGO:-0} go build -o "$tmp/base/" ./cmd/pulse ./cmd/pulse-runtime &&
		mv "$tmp/base/pulse" "$tmp/base/pulse-full" &&
		CGO_ENABLED=${CGO:-0} go build -o "$tmp/base/pulse" ./internal/daemon/front)
fi
pulse=$tmp/pulse-full
inst=$tmp/pulse
mkdir "$tmp/ws"
echo hello >"$tmp/ws/README"
# The probe cache lives under the user's cache dir; a private one keeps
# the run from depending on (or changing) the caller's. The first run
# fills it, as a machine's first pulse exec does.
export XDG_CACHE_HOME=$tmp/cache
# Every pair but the think-time one runs pulse without the namespace
# keeper: in pairs whose reference runs long, the keeper would start the
# next init while the reference is timed (slowing it) and hand it to the
# next pulse (which then did not pay for it). BenchmarkCLINamespaceTrue-
# ThinkTime measures it.
export PULSE_KEEP_WARM=0
have_bwrap=1
bwrap --unshare-all --ro-bind / / true 2>/dev/null || have_bwrap=0
# Ratios against a few-ms reference depend on the machine's load (the
# reference slows down more, in proportion, than pulse's fixed cost):
# the run says what it was.
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# us runs its arguments (a shell snippet) and prints how long it took, in
# microseconds, measured in this shell (no fork for the clock).
us() {
	local t0=$EPOCHREALTIME
	eval "$1" >/dev/null 2>"$tmp/err" || { echo "bench: failed: $1" >&2; cat "$tmp/err" >&2; exit 1; }
	local t1=$EPOCHREALTIME
	echo $(((${t1/./} - ${t0/./})))
}
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# pair NAME UNIT RUNS PREP MEASURED REFERENCE: PREP (untimed) runs before
# each of the two, so that both start from the same state.
pair() {
	local name=$1 unit=$2 runs=$3 prep=$4 mine=$5 ref=$6 a=() b=()
	eval "$prep"
	eval "$mine" >/dev/null 2>&1 || true # first use: page cache, probe cache
	for _ in $(seq "$runs"); do
		eval "$prep"
		a+=("$(us "$mine")")
		eval "$prep"
		b+=("$(us "$ref")")
	done
	local p r
	p=$(median "${a[@]}") r=$(median "${b[@]}")
	awk -v n="$name" -v u="$unit" -v k="$runs" -v p="$p" -v r="$r" \
		'BEGIN {printf "%s\t%d\t%.2f ms/pulse\t%.2f ms/ref\t%.2f %s\n", n, k, p/1e3, r/1e3, p/r, u}'
}

ns="$pulse exec --backend namespace --workspace $tmp/ws"
hostx="$pulse exec --backend host --unsafe-host=network,secrets --workspace $tmp/ws"

# The daemon rows: PULSE_KEEP_WARM=5m lets a daemon run (the rest of the
# script runs with 0: in-process, as before the daemon). The daemon is
# the one of this directory and environment: the first command starts
# it, and warm_daemon waits until it answers before the timed runs.
dmn="PULSE_KEEP_WARM=5m"
trap '[ -z "$srv" ] || kill "$srv" 2>/dev/null; PULSE_KEEP_WARM=5m "$pulse" daemon stop; [ ! -x "$tmp/base/pulse-full" ] || PULSE_KEEP_WARM=5m "$tmp/base/pulse-full" daemon stop; wait 2>/dev/null; rm -rf "$tmp"; echo "load average at end: $(cut -d" " -f1-3 /proc/loadavg)"' EXIT
# warm_daemon CMD [FULL]: FULL (default $pulse) is the full binary whose
# daemon CMD starts.
warm_daemon() {
	eval "$dmn $1" >/dev/null 2>&1 || true
	for _ in $(seq 100); do
		PULSE_KEEP_WARM=5m "${2:-$pulse}" daemon status | grep -q '^daemon pid' && return
		sleep 0.1
	done
	echo "bench: the daemon did not start" >&2
	exit 1
}
# triple NAME UNIT RUNS BEFORE AFTER REFERENCE: pair with two builds of
# pulse in the loop (BASE's and this tree's, which of the two goes first
# alternating), each against the same reference runs.
triple() {
	local name=$1 unit=$2 runs=$3 old=$4 new=$5 ref=$6 a=() b=() c=() i
	eval "$old" >/dev/null 2>&1 || true
	eval "$new" >/dev/null 2>&1 || true
	for i in $(seq "$runs"); do
		if [ $((i % 2)) = 0 ]; then
			a+=("$(us "$old")")
			b+=("$(us "$new")")
		else
			b+=("$(us "$new")")
			a+=("$(us "$old")")
		fi
		c+=("$(us "$ref")")
	done
	local p q r
	p=$(median "${a[@]}") q=$(median "${b[@]}") r=$(median "${c[@]}")
	awk -v n="$name" -v u="$unit" -v k="$runs" -v p="$p" -v q="$q" -v r="$r" \
		'BEGIN {printf "%s\t%d\tbefore %.2f ms/pulse\tafter %.2f ms/pulse\t%.2f ms/ref\tbefore %.2f %s\tafter %.2f %s\tafter/before %.2f\n", n, k, p/1e3, q/1e3, r/1e3, p/r, u, q/r, u, q/p}'
}
printf 'version: 1\nlimits:\n  output_bytes: 512MiB\n' >"$tmp/bulk.yaml"
big="head -c 268435456 /dev/zero"
# The same commands from the full binary itself: the same daemon, a
# client that links all of pulse (go run ./cmd/pulse, go install).
full_rows() {
	if [ "$have_bwrap" = 1 ]; then
		pair BenchmarkCLIFullDaemonNamespaceTrue x-vs-bwrap "$N" : "$dmn $ns -- true" "bwrap --unshare-all --ro-bind / / true"
	fi
	pair BenchmarkCLIFullDaemonHostTrue x-vs-bash "$N" : "$dmn $hostx -- true" "bash -c true"
}
# The daemon rows run pulse as installed.
dns=${ns/$pulse/$inst}
dhostx=${hostx/$pulse/$inst}
daemon_rows() {
	if [ "$have_bwrap" = 1 ]; then
		pair BenchmarkCLINamespaceTrue x-vs-bwrap "$N" : "$ns -- true" "bwrap --unshare-all --ro-bind / / true"
		warm_daemon "$ns -- true"
		pair BenchmarkCLIDaemonNamespaceTrue x-vs-bwrap "$N" : "$dmn $dns -- true" "bwrap --unshare-all --ro-bind / / true"
	fi
	pair BenchmarkCLIHostTrue x-vs-bash "$N" : "$hostx -- true" "bash -c true"
	warm_daemon "$hostx -- true"
	pair BenchmarkCLIDaemonHostTrue x-vs-bash "$N" : "$dmn $dhostx -- true" "bash -c true"
	full_rows
	pair BenchmarkCLIDaemonNamespaceStdout256MiB x-vs-pipe "$NBULK" : "$dmn $dns --policy $tmp/bulk.yaml -- $big | cat >/dev/null" "$big | cat >/dev/null"
	if [ "$have_bwrap" = 1 ]; then
		# 1,000 files written and committed through the daemon, in one
		# workspace the runs share (an agent's: the daemon holds its
		# sandbox), the last run's files moved aside between runs,
		# untimed, on both sides (moved, not deleted: see the ext4 note
		# below); then in a fresh workspace each run, which the daemon
		# opens a sandbox for inside the timed command. Each untimed step
		# ends with a sync: without it, the writeback of the 1,000
		# renames that moved the last run's files aside fell into the
		# timed run of the shared row (slower than the fresh one in the
		# bench, faster by hand).
		mkdir "$tmp/d1k" "$tmp/dold"
		echo hello >"$tmp/d1k/README"
		dmoved=0
		rmfiles="if [ -e $tmp/d1k/f1.txt ]; then mkdir $tmp/dold/\$((++dmoved)) && mv $tmp/d1k/f*.txt $tmp/dold/\$dmoved/; fi; sync"
		warm_daemon "$pulse exec --backend namespace --auto-commit --workspace $tmp/d1k true"
		pair BenchmarkCLIDaemonCommit1000Files x-vs-bwrap-tmpfs "$NBULK" "$rmfiles" \
			"$dmn $inst exec --backend namespace --auto-commit --workspace $tmp/d1k '$files'" \
			"bwrap --unshare-all --ro-bind / / --tmpfs /tmp --chdir /tmp bash -c '$files'"
		dfresh="[ ! -e $tmp/dw1k ] || mv $tmp/dw1k $tmp/dold/\$((++dmoved)); mkdir $tmp/dw1k && echo hello >$tmp/dw1k/README; sync"
		pair BenchmarkCLIDaemonCommit1000FilesFreshWorkspace x-vs-bwrap-tmpfs "$NBULK" "$dfresh" \
			"$dmn $inst exec --backend namespace --auto-commit --workspace $tmp/dw1k '$files'" \
			"bwrap --unshare-all --ro-bind / / --tmpfs /tmp --chdir /tmp bash -c '$files'"
	fi
}
files='for i in $(seq 1000); do echo "file $i" >f$i.txt; done'
# The two daemon `true` rows; with BASE, before and after.
true_rows() {
	local bns bhostx
	if [ -n "${BASE:-}" ]; then
		bns=${dns/$inst/$tmp/base/pulse} bhostx=${dhostx/$inst/$tmp/base/pulse}
	fi
	if [ "$have_bwrap" = 1 ]; then
		warm_daemon "$ns -- true"
		if [ -n "${BASE:-}" ]; then
			warm_daemon "${ns/$pulse/$tmp/base/pulse-full} -- true" "$tmp/base/pulse-full"
			triple BenchmarkCLIDaemonNamespaceTrue x-vs-bwrap "$N" "$dmn $bns -- true" "$dmn $dns -- true" "bwrap --unshare-all --ro-bind / / true"
		else
			pair BenchmarkCLIDaemonNamespaceTrue x-vs-bwrap "$N" : "$dmn $dns -- true" "bwrap --unshare-all --ro-bind / / true"
		fi
	fi
	warm_daemon "$hostx -- true"
	if [ -n "${BASE:-}" ]; then
		warm_daemon "${hostx/$pulse/$tmp/base/pulse-full} -- true" "$tmp/base/pulse-full"
		triple BenchmarkCLIDaemonHostTrue x-vs-bash "$N" "$dmn $bhostx -- true" "$dmn $dhostx -- true" "bash -c true"
	else
		pair BenchmarkCLIDaemonHostTrue x-vs-bash "$N" : "$dmn $dhostx -- true" "bash -c true"
	fi
}
if [ "${ROWS:-all}" = true ]; then
	true_rows
	exit 0
fi
if [ "${ROWS:-all}" = daemon ]; then
	daemon_rows
	exit 0
fi
if [ "${ROWS:-all}" = stdout ]; then
	# Only the daemon's 256 MiB stdout row, against the direct pipe.
	warm_daemon "$ns -- true"
	pair BenchmarkCLIDaemonNamespaceStdout256MiB x-vs-pipe "$NBULK" : "$dmn $dns --policy $tmp/bulk.yaml -- $big | cat >/dev/null" "$big | cat >/dev/null"
	exit 0
fi
if [ "$have_bwrap" = 1 ]; then
	pair BenchmarkCLINamespaceTrue x-vs-bwrap "$N" : "$ns -- true" "bwrap --unshare-all --ro-bind / / true"
	# The agent's pattern: 0.3 s between commands (untimed on both
	# sides), in which the keeper, which the first pulse exec starts,
	# starts the init the next one takes over. Not a back-to-back figure:
	# the init is made in the pause; the row above is what a script that
	# runs pulse back to back gets (the keeper then steps aside).
	# In-process (PULSE_NO_DAEMON=1): the keeper's figure.
	pair BenchmarkCLINamespaceTrueThinkTime x-vs-bwrap "$N" "sleep 0.3" "PULSE_NO_DAEMON=1 PULSE_KEEP_WARM=5m $ns -- true" "bwrap --unshare-all --ro-bind / / true"
else
	echo "BenchmarkCLINamespaceTrue: bwrap cannot run here, no ratio"
fi
pair BenchmarkCLIHostTrue x-vs-bash "$N" : "$hostx -- true" "bash -c true"
if [ "$have_bwrap" = 1 ]; then
	warm_daemon "$ns -- true"
	pair BenchmarkCLIDaemonNamespaceTrue x-vs-bwrap "$N" : "$dmn $dns -- true" "bwrap --unshare-all --ro-bind / / true"
fi
warm_daemon "$hostx -- true"
pair BenchmarkCLIDaemonHostTrue x-vs-bash "$N" : "$dmn $dhostx -- true" "bash -c true"
full_rows
# What the Go heap in huge pages (internal/hugeheap) saves each pulse
# process: the same command with it turned off as the reference.
pair BenchmarkCLIHostTrueHugeHeap x-vs-small-pages "$N" : "$hostx -- true" "PULSE_HUGEPAGES=0 $hostx -- true"
# The same in a workspace with 40 pending transactions (an agent's
# commands, none reviewed yet; made once, untimed, by 40 namespace
# commands that each write a file): what the pending stack costs a
# command that reads none of it. Compare with the row above.
if [ "$have_bwrap" = 1 ]; then
	mkdir "$tmp/ws40"
	for i in $(seq 40); do
		"$pulse" exec --backend namespace --workspace "$tmp/ws40" -- sh -c "echo $i >f$i" >/dev/null 2>&1
	done
	pending=$(find "$tmp/ws40/.pulse/cow/tx" -mindepth 1 -maxdepth 1 -type d | wc -l)
	[ "$pending" = 40 ] || { echo "bench: BenchmarkCLIHostTruePending40: $pending pending transactions, not 40" >&2; exit 1; }
	pair BenchmarkCLIHostTruePending40 x-vs-bash "$N" : "$pulse exec --backend host --unsafe-host=network,secrets --workspace $tmp/ws40 -- true" "bash -c true"
fi

# The default output cap (16 MiB) would cut the stream short: bulk.yaml.
pair BenchmarkCLINamespaceStdout256MiB x-vs-pipe "$NBULK" : "$ns --policy $tmp/bulk.yaml -- $big | cat >/dev/null" "$big | cat >/dev/null"
pair BenchmarkCLIHostStdout256MiB x-vs-pipe "$NBULK" : "$hostx --policy $tmp/bulk.yaml -- $big | cat >/dev/null" "$big | cat >/dev/null"

if [ "$have_bwrap" = 1 ]; then
	# Each run starts from a fresh workspace. The one before is moved
	# aside, not deleted, until the end: ext4 without a journal (this
	# machine class's root) skips inodes freed in the last 30 s to 3 min
	# when it allocates, reading each one's inode table entry, so a loop
	# that deletes the last run's 1,000 files makes every later creation
	# slower, on both sides, more with each run (bwrap on the same disk
	# went from 60 ms to 820 ms in one run). What pulse deletes itself
	# (the overlay's upper directory, before it exits) stays measured.
	mkdir "$tmp/old"
	moved=0
	fresh="[ ! -e $tmp/w1k ] || mv $tmp/w1k $tmp/old/\$((++moved)); mkdir $tmp/w1k && echo hello >$tmp/w1k/README"
	pair BenchmarkCLICommit1000Files x-vs-bwrap-tmpfs "$NBULK" "$fresh" \
		"$pulse exec --backend namespace --auto-commit --workspace $tmp/w1k '$files'" \
		"bwrap --unshare-all --ro-bind / / --tmpfs /tmp --chdir /tmp bash -c '$files'"
	# The same against bwrap writing straight into a directory on the
	# workspace's own disk (no overlay, no review, no fsync): how much of
	# the first ratio is that disk rather than the sandbox.
	pair BenchmarkCLICommit1000Files x-vs-bwrap-same-disk "$NBULK" "$fresh" \
		"$pulse exec --backend namespace --auto-commit --workspace $tmp/w1k '$files'" \
		"bwrap --unshare-all --ro-bind / / --bind $tmp/w1k $tmp/w1k --chdir $tmp/w1k bash -c '$files'"
	# Where the two runs above kept the overlay's upper directory: the
	# default state dir ($XDG_RUNTIME_DIR, else the temp dir).
	echo "BenchmarkCLICommit1000Files: workspace on $(stat -f -c %T "$tmp"), state dir on $(stat -f -c %T "${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}")"
	if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
		shm=$(mktemp -d /dev/shm/pulse-bench.XXXXXX)
		trap '[ -z "$srv" ] || kill "$srv" 2>/dev/null; wait 2>/dev/null; PULSE_KEEP_WARM=5m "$pulse" daemon stop; rm -rf "$tmp" "$shm"; echo "load average at end: $(cut -d" " -f1-3 /proc/loadavg)"' EXIT
		mkdir -m 700 "$shm/run"
		# The workspace on the disk, the upper directory on a tmpfs.
		pair BenchmarkCLICommit1000FilesStateTmpfs x-vs-bwrap-tmpfs "$NBULK" "$fresh" \
			"XDG_RUNTIME_DIR=$shm/run $pulse exec --backend namespace --auto-commit --workspace $tmp/w1k '$files'" \
			"bwrap --unshare-all --ro-bind / / --tmpfs /tmp --chdir /tmp bash -c '$files'"
		# Everything on the tmpfs, on both sides.
		mkdir "$shm/old"
		freshm="[ ! -e $shm/w1k ] || mv $shm/w1k $shm/old/\$((++moved)); mkdir $shm/w1k && echo hello >$shm/w1k/README"
		pair BenchmarkCLICommit1000FilesAllTmpfs x-vs-bwrap-tmpfs "$NBULK" "$freshm" \
			"XDG_RUNTIME_DIR=$shm/run $pulse exec --backend namespace --auto-commit --workspace $shm/w1k '$files'" \
			"bwrap --unshare-all --ro-bind / / --bind $shm/w1k $shm/w1k --chdir $shm/w1k bash -c '$files'"
	else
		echo "BenchmarkCLICommit1000FilesStateTmpfs, BenchmarkCLICommit1000FilesAllTmpfs: /dev/shm is not a tmpfs here, skipped"
	fi
fi

# Remote: pulse-server on loopback with the host executor; the reference
# is the host CLI itself, so the difference is what the remote hop adds.
port=$(( (RANDOM % 20000) + 30000 ))
PULSE_REMOTE_TOKEN=bench-token-0123456789abcdef0123456789abcdef "$tmp/pulse-server" --development \
	--backend host --unsafe-host --host 127.0.0.1 --port "$port" \
	--workspace-root "$tmp/srv/ws" --database "$tmp/srv/db.sqlite3" >"$tmp/srv.log" 2>&1 &
srv=$!
for _ in $(seq 100); do
	grep -q listening "$tmp/srv.log" 2>/dev/null && break
	sleep 0.05
done
if grep -q listening "$tmp/srv.log"; then
	# The host executor cannot deny the network, so both sides run under
	# a policy that allows it.
	printf 'version: 1\ndefaults:\n  network: allow\n  secrets: allow\nnetwork:\n  mode: allow-all\n' >"$tmp/net.yaml"
	rem="PULSE_REMOTE_URL=ws://127.0.0.1:$port PULSE_REMOTE_TOKEN=bench-token-0123456789abcdef0123456789abcdef $pulse exec --policy $tmp/net.yaml --secrets allow-all --workspace $tmp/ws"
	out=$(pair BenchmarkCLIRemoteTrue x-vs-host "$N" : "$rem -- true" "$hostx --policy $tmp/net.yaml --secrets allow-all -- true")
	awk -F'\t' '{split($3, p, " "); split($4, r, " "); printf "%s\t%s\t%s\t%s\t%.2f ms-over-host\t%s\n", $1, $2, $3, $4, p[1]-r[1], $5}' <<<"$out"
else
	echo "BenchmarkCLIRemoteTrue: pulse-server did not start:"
	cat "$tmp/srv.log"
fi
