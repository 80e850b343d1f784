# `make test` is the one command that checks everything: it prepares the
# test environment (Docker engine and test image, see scripts/testenv.sh),
# then runs the format check, go vet and the race-enabled test suite.
GO ?= go
FUZZTIME ?= 10s

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test testenv check fmt vet lint cross unit fuzz bench bench-agent build docs fleet-e2e k8s-check

test: testenv check

check: fmt vet lint cross unit

fmt:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# staticcheck at a pinned version, fetched from the module proxy on first use.
lint:
	$(GO) run $(STATICCHECK) ./...

# cowfs, the SDK and the CLI build, and pass vet, on macOS too (stat
# fields and renameat2-like calls per OS, in _linux and _darwin files).
cross:
	GOOS=darwin GOARCH=arm64 $(GO) build ./cowfs/ ./sandbox/ ./cmd/pulse/ ./internal/daemon/front/
	GOOS=darwin GOARCH=arm64 $(GO) vet ./cowfs/ ./sandbox/ ./cmd/pulse/ ./internal/daemon/front/

# The timeout is per package: backend/docker's suite runs for minutes
# on 2 loaded cores, and a timeout kills the whole package's report.
unit:
	$(GO) test -race -timeout 30m ./...

testenv:
	@./scripts/testenv.sh

# Every command, static. bin/pulse is the thin front end
# (internal/daemon/front), the full pulse program beside it as
# bin/pulse-full: the front end hands exec and cow to the user's daemon
# and runs pulse-full for the rest. It starts in a third of the time the
# full binary takes (22 MB, whose package initialisers all run before
# main), which is most of what a `pulse exec` through the daemon costs.
build:
	CGO_ENABLED=0 $(GO) build -o bin/ ./cmd/...
	mv -f bin/pulse bin/pulse-full
	CGO_ENABLED=0 $(GO) build -o bin/pulse ./internal/daemon/front

fuzz:
	@FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

bench:
	@./scripts/bench.sh

# The agent-loop battery on a clone of this repository (bench/agent/run.sh):
# each step through pulse exec on namespace and Docker against the same
# command run directly. N runs each (default 3; CI runs N=1). Exit 1 when
# a step does not pass.
bench-agent:
	@./scripts/testenv.sh
	@./bench/agent/run.sh

# docs/cli.md's reference sections are the commands' help as the
# binaries print it (pulse, pulse-server, pulse-worker); this rewrites
# them. Their tests fail, naming this target, until it is run after a
# command's help or flags change.
docs:
	PULSE_UPDATE_DOCS=1 $(GO) test -count=1 -run '^(TestCLIReferenceIsCurrent|TestFlagReferenceIsCurrent)$$' ./cmd/pulse/ ./cmd/pulse-server/ ./cmd/pulse-worker/

# The fleet end to end (bench/fleet): a real Postgres (Debian's, which
# scripts/testenv.sh installs), 3 pulse-servers and 6 pulse-workers as
# processes on 127.0.0.1, 300 clients for 2 minutes, one server and two
# workers SIGKILLed mid-load and restarted. Prints the summary line and
# exits 1 on any lost or twice-run execution. A single server's latency
# under the same load (same workers, clients and commands) is measured
# first, in the same run; about 4 minutes on 2 cores.
fleet-e2e:
	@./scripts/testenv.sh
	$(GO) run ./bench/fleet

# deploy/k8s/ on a real control plane (scripts/k8s-check.sh): kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl built from the
# Kubernetes Go modules at go.mod's k8s.io/api version (cached under the
# user cache dir; tens of minutes the first time), Debian's etcd
# (apt-get install -y etcd-server) and kwok nodes. Applies the manifests and
# waits until every Deployment is Available. Not part of make test or CI.
k8s-check:
	@./scripts/k8s-check.sh
