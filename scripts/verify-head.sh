#!/usr/bin/env bash
# Checks that the committed HEAD builds and vets on its own, without the
# uncommitted files of a shared work tree: clones HEAD into a temporary
# directory and runs go vet there (and the tests of the given packages).
# usage: scripts/verify-head.sh [PKG...]
set -euo pipefail
top=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$top" "$tmp/repo"
cd "$tmp/repo"
go vet ./...
if [ $# -gt 0 ]; then go test -count=1 "$@"; fi
echo "verify-head: $(git rev-parse --short HEAD) builds and vets"
