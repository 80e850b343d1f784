#!/usr/bin/env bash
# Checks that the committed HEAD builds and vets on its own, without the
# uncommitted files of a shared work tree: clones HEAD into a temporary
# directory and runs the gofmt check and go vet there (and the tests of the
# given packages).
# usage: scripts/verify-head.sh [PKG...]
set -euo pipefail
top=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$top" "$tmp/repo"
cd "$tmp/repo"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "verify-head: gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
if [ $# -gt 0 ]; then go test -count=1 "$@"; fi
echo "verify-head: $(git rev-parse --short HEAD) builds and vets"
