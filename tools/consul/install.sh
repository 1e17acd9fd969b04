#!/usr/bin/env bash
# install.sh builds the Consul agent the tests run, from the Go module proxy, and
# caches it. It prints the binary's path on stdout; everything else goes to stderr.
#
# Consul v1.14.8 is the newest MPL-2.0 release the proxy serves whose dependency
# graph we accept; the script refuses to build anything whose LICENSE is not MPL-2.0.
set -euo pipefail

VERSION=v1.14.8
CACHE="${SHARELIMIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sharelimit}/consul-$VERSION"
BIN="$CACHE/consul"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9 # two test runs never build at once; the second waits and reuses the first's binary

# Read the version whole before matching: grep -q would close the pipe early and,
# under pipefail, SIGPIPE would fail the check and force a rebuild.
if [[ -x "$BIN" ]] && ver="$("$BIN" version 2>/dev/null)" && [[ $ver == *"Consul ${VERSION}"* ]]; then
	echo "$BIN"
	exit 0
fi

echo "building consul $VERSION into $CACHE (a few minutes on a cold machine)" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$HERE/go.mod" "$work/go.mod"
[[ -f "$HERE/go.sum" ]] && cp "$HERE/go.sum" "$work/go.sum"
cd "$work"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
go get "github.com/hashicorp/consul@$VERSION" >&2

src="$(go list -m -f '{{.Dir}}' "github.com/hashicorp/consul")"
if ! grep -q "Mozilla Public License" "$src/LICENSE" || ! grep -q "Version 2.0" "$src/LICENSE"; then
	echo "refusing to build: $src/LICENSE is not MPL-2.0" >&2
	exit 1
fi

CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" github.com/hashicorp/consul >&2
mv "$BIN.tmp" "$BIN"
echo "$BIN"
