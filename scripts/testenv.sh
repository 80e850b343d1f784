#!/usr/bin/env bash
# Prepares what the test suite needs on a fresh machine and is a no-op when
# it is already there. Safe to run again and again.
#
# The Docker backend's tests need an engine and the sandbox image. As root,
# this script installs Debian's docker.io when dockerd is missing, starts
# dockerd in the background when no engine answers, and builds the image
# with `pulse image build` when it is missing. Not root and no engine: it
# says why and exits 0, and the Docker tests skip (with
# PULSE_REQUIRE_DOCKER=1, as in CI, they fail instead).
set -euo pipefail
cd "$(dirname "$0")/.."

image=${PULSE_DOCKER_IMAGE:-pulse-sandbox:latest}
log=${PULSE_DOCKERD_LOG:-/tmp/pulse-dockerd.log}
wait_s=${PULSE_DOCKERD_WAIT:-60}

dockerd_running() { grep -qsx dockerd /proc/[0-9]*/comm; }

engine_answers() { docker version >/dev/null 2>&1; }

say() { echo "testenv: $*" >&2; }

if ! command -v docker >/dev/null 2>&1 || ! engine_answers; then
	if [ "$(id -u)" != 0 ]; then
		say "no Docker engine answers and this is not root, so none can be started here;"
		say "the Docker tests will skip (or fail with PULSE_REQUIRE_DOCKER=1)"
		exit 0
	fi
	if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
		say "installing docker.io from apt"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq docker.io >/dev/null
	fi
	if ! engine_answers; then
		# A socket left by a dead dockerd makes a new one refuse to start.
		if [ -S /var/run/docker.sock ] && ! dockerd_running; then
			rm -f /var/run/docker.sock
		fi
		if ! dockerd_running; then
			say "starting dockerd in the background (log: $log)"
			nohup dockerd >"$log" 2>&1 </dev/null &
		else
			say "dockerd is running but does not answer yet; waiting"
		fi
		deadline=$((SECONDS + wait_s))
		until engine_answers; do
			if [ $SECONDS -ge $deadline ]; then
				say "dockerd did not answer within ${wait_s}s; last lines of $log:"
				tail -n 20 "$log" >&2 || true
				exit 1
			fi
			sleep 0.5
		done
		say "dockerd answers"
	fi
fi

# `make unit` runs the tests with -race, which needs cgo and so a C
# compiler: without one the go command turns cgo off and refuses -race.
# A fresh Debian machine with only Go installed has none.
if ! command -v gcc >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	say "installing gcc from apt (go test -race needs cgo)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq gcc libc6-dev >/dev/null
fi

# The egress bypass suite runs curl inside the sandbox (TLS through the
# proxy, the sandbox CA in the trust store): the namespace backend's
# sandboxes see the host's, and the image brings the host's curl with its
# libraries; an image built before that is built again.
if ! command -v curl >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	say "installing curl from apt (the egress bypass suite runs it in the sandbox)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq curl >/dev/null
fi
image_has_curl() {
	docker run --rm --network none --entrypoint /usr/local/bin/curl "$image" --version >/dev/null 2>&1
}
if ! docker image inspect "$image" >/dev/null 2>&1 || { command -v curl >/dev/null 2>&1 && ! image_has_curl; }; then
	# The image is built around a static busybox from the host; a fresh
	# Debian machine does not have one.
	if [ "$(id -u)" = 0 ]; then
		pkgs=""
		[ -x /bin/busybox ] || pkgs="$pkgs busybox-static"
		[ -f /etc/ssl/certs/ca-certificates.crt ] || pkgs="$pkgs ca-certificates"
		if [ -n "$pkgs" ]; then
			say "installing$pkgs from apt (the sandbox image is built from them)"
			export DEBIAN_FRONTEND=noninteractive
			apt-get update -qq
			# shellcheck disable=SC2086
			apt-get install -y -qq $pkgs >/dev/null
		fi
	fi
	with=()
	if command -v curl >/dev/null 2>&1; then
		with=(--with curl)
	else
		say "no curl on this machine and this is not root: the image gets none, and the egress suite's curl checks skip (or fail in CI)"
	fi
	say "building the sandbox image $image"
	go run ./cmd/pulse image build --tag "$image" "${with[@]}"
fi
say "Docker engine and image $image are ready"

# The `pulse mcp` test drives the server with the official MCP TypeScript
# SDK, from npm: it needs node, and the SDK installed from the committed
# package-lock.json. As root, Debian's nodejs and npm are installed when
# node is missing. Without them the test skips (in CI it fails).
mcp_client=cmd/pulse/testdata/mcp-client
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ]; then
		say "installing nodejs and npm from apt (the MCP client test runs on node)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq nodejs npm >/dev/null
	else
		say "node is missing and this is not root; the MCP client test will skip"
	fi
fi
if command -v npm >/dev/null 2>&1 && ! [ -d "$mcp_client/node_modules/@modelcontextprotocol/sdk" ]; then
	say "installing the MCP TypeScript SDK in $mcp_client (npm ci)"
	(cd "$mcp_client" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The `pulse review` browser test drives the page in Debian's chromium with
# playwright-core from npm (no browser download): it needs chromium, node,
# and playwright-core installed from the committed package-lock.json. As
# root, what is missing is installed. Without them the test skips (in CI it
# fails).
review_browser=cmd/pulse/testdata/review-browser
if [ "$(id -u)" = 0 ]; then
	if ! [ -x /usr/bin/chromium ]; then
		say "installing chromium from apt (the review page's browser test runs in it)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq chromium >/dev/null
	fi
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
		say "installing nodejs and npm from apt (the review page's browser test runs on node)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq nodejs npm >/dev/null
	fi
elif ! [ -x /usr/bin/chromium ] || ! command -v node >/dev/null 2>&1; then
	say "chromium or node is missing and this is not root; the review browser test will skip"
fi
if command -v npm >/dev/null 2>&1 && ! [ -d "$review_browser/node_modules/playwright-core" ]; then
	say "installing playwright-core in $review_browser (npm ci)"
	(cd "$review_browser" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The agent-loop battery (bench/agent/run.sh: `make bench-agent`, CI) runs
# git, go, python3 and make directly and brings them into a toolchain
# image (so does cmd/pulse's toolchain image test, which fails in CI
# without them); of those a fresh Debian machine may lack python3. As root it is
# installed; without it the battery says so and fails.
if ! command -v python3 >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ]; then
		say "installing python3 from apt (the agent-loop battery runs it)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq python3 >/dev/null
	else
		say "python3 is missing and this is not root; the agent-loop battery will fail"
	fi
fi

# The Postgres store's tests start a throwaway cluster of their own with
# initdb and pg_ctl from Debian's postgresql (internal/testenv
# StartPostgres: a private Unix socket, no port, removed afterwards); they
# need only the programs. As root, the package is installed when missing.
# The cluster the package may create and start is not used and is
# stopped, so no server of it stays running. Without the programs the
# tests skip (in CI, PULSE_REQUIRE_POSTGRES=1, they fail).
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && ! command -v initdb >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ]; then
		say "installing postgresql from apt (the Postgres store's tests start a cluster of their own)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq postgresql >/dev/null
		if command -v pg_lsclusters >/dev/null 2>&1; then
			pg_lsclusters --no-header 2>/dev/null | while read -r ver name _; do
				pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
			done
		fi
	else
		say "postgresql is missing and this is not root; the Postgres store's tests will skip"
	fi
fi

# The gVisor backend's tests need runsc, as root. The pinned build of the
# gVisor Go module (the published go branch) is built once into a cache
# and linked as /usr/local/bin/runsc, ahead of Debian's on PATH: it has
# the systrap platform and answers statx, which Debian's 2022 runsc does
# not. The build takes about ten minutes on two loaded cores; where it
# fails (no module proxy, no Go), Debian's runsc is installed instead and
# the tests that need the newer one skip, naming why. PULSE_RUNSC_BUILD=0
# skips the build. Without root the gVisor tests skip (in CI,
# PULSE_REQUIRE_GVISOR=1, they fail).
runsc_pin=v0.0.0-20260905035102-160fafc42237
runsc_cache=${PULSE_RUNSC_CACHE:-/var/cache/pulse/runsc/$runsc_pin}
if [ "$(id -u)" = 0 ]; then
	if [ ! -x "$runsc_cache/runsc" ] && [ "${PULSE_RUNSC_BUILD:-1}" != 0 ] && command -v go >/dev/null 2>&1; then
		say "building runsc $runsc_pin from the gVisor Go module into $runsc_cache (about ten minutes, once)"
		mkdir -p "$runsc_cache"
		if ! GOBIN="$runsc_cache" CGO_ENABLED=0 go install "gvisor.dev/gvisor/runsc@$runsc_pin" >"$runsc_cache/build.log" 2>&1; then
			say "the runsc build failed (see $runsc_cache/build.log); falling back to Debian's runsc"
			rm -f "$runsc_cache/runsc"
		fi
	fi
	if [ -x "$runsc_cache/runsc" ]; then
		ln -sf "$runsc_cache/runsc" /usr/local/bin/runsc
	elif ! command -v runsc >/dev/null 2>&1; then
		say "installing runsc from apt (Debian's gVisor build) for the gVisor backend's tests"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq runsc >/dev/null
	fi
else
	command -v runsc >/dev/null 2>&1 || say "runsc is missing and this is not root; the gVisor tests will skip"
fi
