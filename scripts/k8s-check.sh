#!/usr/bin/env bash
# make k8s-check: apply deploy/k8s/ to a real Kubernetes control plane and
# wait until every Deployment is Available.
#
# The control plane is built from the Kubernetes Go modules at the version
# of k8s.io/api in go.mod (kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl) and run with Debian's etcd; the nodes are
# kwok's (sigs.k8s.io/kwok, built from its module), which play the kubelet:
# they take the scheduled pods and report them running and ready. So this
# checks what the API server and the controllers say of the manifests:
# strict validation, admission (Pod Security, enforced at "baseline" with
# "restricted" warnings shown), scheduling against the requests, the
# claims, the budget and the Deployments' rollout. It runs no container:
# the images need not exist.
#
# The binaries are cached under the user cache directory
# (${XDG_CACHE_HOME:-~/.cache}/pulse/k8s-check/<version>/bin). The first
# build takes tens of minutes on two cores (95 at nice 19 on two busy
# ones); a run with the binaries cached, a few minutes.
# Needs: go, openssl, etcd (apt-get install -y etcd-server). Not part of
# CI (make test checks the manifests in process, deploy/k8s/manifest_test.go).
#
# Usage: scripts/k8s-check.sh [build|run]   (default: both)
#   K8S_CHECK_TIMEOUT  seconds to wait for the Deployments (default 300)
#   K8S_CHECK_KEEP=1   leave the control plane's directory for inspection
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

api_version=$(go list -m -f '{{.Version}}' k8s.io/api)   # v0.37.2
k8s_version=${K8S_VERSION:-v1.${api_version#v0.}}        # v1.37.2
kwok_version=${KWOK_VERSION:-v0.8.0}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/pulse/k8s-check/$k8s_version
bin=$cache/bin
timeout=${K8S_CHECK_TIMEOUT:-300}

log() { printf 'k8s-check: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# build makes the binaries the check runs, once per version. The
# k8s.io/kubernetes module points its k8s.io/* requirements at its
# staging directory, which its module zip leaves out, so it cannot be
# built with go install pkg@version: a module of our own requires it and
# replaces each staging module with its published release, v0.X.Y for
# v1.X.Y.
build() {
	local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl kwok) missing=() b
	for b in "${want[@]}"; do [[ -x $bin/$b ]] || missing+=("$b"); done
	if ((${#missing[@]} == 0)); then
		log "binaries of $k8s_version cached in $bin"
		return
	fi
	mkdir -p "$bin" "$cache/src"
	local src=$cache/src gomod
	gomod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
	[[ -f $gomod ]] || die "cannot download k8s.io/kubernetes@$k8s_version"
	{
		printf 'module pulse.local/k8s-check\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' \
			"$(sed -n 's/^go //p' "$gomod")" "$k8s_version"
		sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$api_version"'#p' "$gomod"
		printf ')\n'
	} >"$src/go.mod"
	local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
	ldflags+=" -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$k8s_version")"
	ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
	log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $k8s_version into $bin (tens of minutes the first time)"
	(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -ldflags "$ldflags" -o "$bin/" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl)
	log "building kwok $kwok_version"
	CGO_ENABLED=0 GOBIN=$bin go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
	log "built into $bin"
}

# free_port prints a port nothing on 127.0.0.1 listens on.
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 30000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

# wait_for runs "$@" until it succeeds, for at most $1 seconds.
wait_for() {
	local limit=$1 i
	shift
	for ((i = 0; i < limit; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
	done
	"$@"
}

pids=()
# stop ends the components last started first: kube-apiserver waits for
# etcd in its graceful shutdown, and hangs on when etcd went first. Each
# gets 30 s before SIGKILL.
stop() {
	local i p n
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		p=${pids[i]}
		kill "$p" 2>/dev/null || continue
		for ((n = 0; n < 30; n++)); do
			kill -0 "$p" 2>/dev/null || break
			sleep 1
		done
		kill -9 "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	if [[ -n ${K8S_CHECK_KEEP:-} ]]; then
		log "kept $dir"
	else
		rm -rf "$dir"
	fi
}

# start NAME CMD...: runs CMD in the background, its output in $dir/NAME.log.
start() {
	local name=$1
	shift
	"$@" >"$dir/$name.log" 2>&1 &
	pids+=($!)
}

# fail prints the end of every component's log, then exits 1.
fail() {
	log "FAIL: $*"
	local f
	for f in "$dir"/*.log; do
		printf '\n==> %s <==\n' "$f" >&2
		tail -n 15 "$f" >&2
	done
	exit 1
}

run() {
	command -v etcd >/dev/null || die "etcd not found: apt-get install -y etcd-server"
	command -v openssl >/dev/null || die "openssl not found"
	local b
	for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
		[[ -x $bin/$b ]] || die "$bin/$b missing: run $0 build first"
	done
	dir=$(mktemp -d "${TMPDIR:-/tmp}/pulse-k8s-check.XXXXXX")
	trap stop EXIT
	local etcd_port peer_port api_port token kwok_src advertise
	etcd_port=$(free_port) peer_port=$(free_port) api_port=$(free_port)
	token=$(openssl rand -hex 16)
	mkdir -p "$dir/pki"
	openssl genrsa -out "$dir/pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$dir/pki/sa.key" -pubout -out "$dir/pki/sa.pub" 2>/dev/null
	printf '%s,admin,admin,system:masters\n' "$token" >"$dir/pki/tokens.csv"
	cat >"$dir/kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: check
		  cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}
		users:
		- name: admin
		  user: {token: "$token"}
		contexts:
		- name: check
		  context: {cluster: check, user: admin, namespace: pulse}
		current-context: check
	EOF
	export KUBECONFIG=$dir/kubeconfig
	local kubectl=$bin/kubectl

	log "etcd $(etcd --version | sed -n 's/^etcd Version: //p') on 127.0.0.1:$etcd_port"
	start etcd etcd --name check --data-dir "$dir/etcd" \
		--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
		--initial-cluster "check=http://127.0.0.1:$peer_port"
	# The endpoint of the kubernetes Service may not be a loopback
	# address; nothing dials it here.
	advertise=$(hostname -I 2>/dev/null | awk '{print $1}')
	log "kube-apiserver $k8s_version on 127.0.0.1:$api_port"
	start kube-apiserver "$bin/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$etcd_port" \
		--bind-address 127.0.0.1 --secure-port "$api_port" --advertise-address "${advertise:-192.0.2.1}" \
		--cert-dir "$dir/pki" --token-auth-file "$dir/pki/tokens.csv" --authorization-mode RBAC \
		--service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key" \
		--service-cluster-ip-range 10.96.0.0/16
	wait_for 120 "$kubectl" get --raw /readyz || fail "kube-apiserver not ready"
	start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$KUBECONFIG" \
		--leader-elect=false --secure-port 0 --service-account-private-key-file "$dir/pki/sa.key" \
		--cluster-name check
	start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false --secure-port 0

	# kwok plays the kubelet of every node, with its own stages: a node
	# becomes Ready and keeps sending heartbeats; a pod is created, its
	# containers run and become ready (its probes are not run).
	kwok_src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$kwok_version/kustomize/stage
	[[ -d $kwok_src ]] || go mod download "sigs.k8s.io/kwok@$kwok_version"
	{
		for f in node/fast/node-initialize node/heartbeat/node-heartbeat \
			pod/general/pod-create pod/general/pod-init-container-running pod/general/pod-init-container-completed \
			pod/general/pod-ready pod/general/pod-complete pod/general/pod-delete; do
			cat "$kwok_src/$f.yaml"
			printf '\n---\n'
		done
	} >"$dir/kwok.yaml"
	start kwok "$bin/kwok" --kubeconfig "$KUBECONFIG" --config "$dir/kwok.yaml" --manage-all-nodes=true --cidr 10.244.0.0/16
	local n
	for n in 1 2 3; do
		cat <<-EOF
			apiVersion: v1
			kind: Node
			metadata:
			  name: kwok-node-$n
			  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$n, kubernetes.io/os: linux}
			  annotations: {kwok.x-k8s.io/node: fake}
			status:
			  allocatable: {cpu: "4", memory: 16Gi, pods: "110"}
			  capacity: {cpu: "4", memory: 16Gi, pods: "110"}
			---
		EOF
	done >"$dir/nodes.yaml"
	# The pods' namespace enforces Pod Security "baseline" and warns
	# at "restricted": the worker's one documented exception
	# (procMount: Unmasked, with hostUsers: false) shows as a warning.
	cat >"$dir/cluster.yaml" <<-EOF
		apiVersion: v1
		kind: Namespace
		metadata:
		  name: pulse
		  labels:
		    pod-security.kubernetes.io/enforce: baseline
		    pod-security.kubernetes.io/warn: restricted
		    pod-security.kubernetes.io/audit: restricted
		---
		# What a cluster without a volume provisioner offers the
		# StatefulSet's claim: a volume of no class, which the claim binds.
		apiVersion: v1
		kind: PersistentVolume
		metadata: {name: pulse-check-postgres}
		spec:
		  capacity: {storage: 20Gi}
		  accessModes: [ReadWriteOnce]
		  hostPath: {path: /var/lib/pulse-check-postgres}
	EOF
	"$kubectl" apply -f "$dir/nodes.yaml" -f "$dir/cluster.yaml" >/dev/null || fail "cannot create the nodes"
	wait_for 60 "$kubectl" wait --for=condition=Ready node --all --timeout=1s || fail "kwok's nodes not Ready"
	wait_for 60 "$kubectl" get serviceaccount default || fail "no default ServiceAccount in pulse"

	# The secrets the manifests' comments say to create; the values are
	# placeholders, nothing reads them here.
	"$kubectl" create secret generic pulse-tokens --from-literal=remote-token=check --from-literal=worker-token=check >/dev/null
	"$kubectl" create secret generic pulse-tls --from-literal=tls.crt=check --from-literal=tls.key=check --from-literal=ca.crt=check >/dev/null
	"$kubectl" create secret generic pulse-database --from-literal=url=postgres://check --from-literal=password=check >/dev/null

	# The ExternalName variant is checked by the API server too, not
	# applied: it and the StatefulSet's file define the same Service.
	"$kubectl" apply --dry-run=server -f deploy/k8s/postgres-external.yaml >/dev/null || fail "the API server refuses postgres-external.yaml"
	log "applying deploy/k8s/pulse.yaml and deploy/k8s/postgres-statefulset.yaml"
	"$kubectl" apply -f deploy/k8s/postgres-statefulset.yaml -f deploy/k8s/pulse.yaml >&2 2>"$dir/apply.err" ||
		{ cat "$dir/apply.err" >&2; fail "the API server refuses deploy/k8s"; }
	if [[ -s $dir/apply.err ]]; then
		log "the API server's warnings:"
		sed 's/^/  /' "$dir/apply.err" >&2
	fi
	log "waiting (at most ${timeout}s) for every Deployment to be Available"
	if ! "$kubectl" wait --for=condition=Available deployment --all --timeout="${timeout}s" >&2; then
		"$kubectl" get deployment,statefulset,pod,pvc -o wide >&2 || true
		"$kubectl" get events --sort-by=.lastTimestamp >&2 || true
		fail "not every Deployment became Available"
	fi
	local d
	for d in $("$kubectl" get deployment -o name) statefulset/pulse-postgres; do
		"$kubectl" rollout status "$d" --timeout="${timeout}s" >&2 || fail "$d did not roll out"
	done
	"$kubectl" get deployment,statefulset,pdb,pvc >&2
	log "ok: every Deployment of deploy/k8s is Available on kube-apiserver $k8s_version with kwok nodes"
}

case ${1:-all} in
build) build ;;
run) run ;;
all) build && run ;;
*) die "usage: $0 [build|run]" ;;
esac
