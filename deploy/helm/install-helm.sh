#!/usr/bin/env bash
# Install helm for the chart's tests: built from source with `go install` through the Go module proxy (no
# release download: this machine reaches package registries only). Prints the path of the binary.
#
#   deploy/helm/install-helm.sh          build it unless the cached one is there, then print its path
#
# HELM_VERSION picks the release (default v3.21.4, Helm 3: what most CD tools still embed; the chart is a
# v2 chart that Helm 4 reads too). The binary is kept in ~/.cache/outbox-cdc/helm-<version>/ so that the
# next run on this machine, from any clone, reuses it (about 3 minutes to build the first time, seconds with
# Go's build cache warm); a missing one is simply built again.
set -euo pipefail

VERSION=${HELM_VERSION:-v3.21.4}
MAJOR=${VERSION%%.*}
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-cdc/helm-$VERSION
BIN=$DIR/helm

if [ -x "$BIN" ] && "$BIN" version --short 2>/dev/null | grep -q "^$VERSION"; then
    printf '%s\n' "$BIN"
    exit 0
fi
# A login shell puts /usr/local/go/bin on PATH; a CI job's may not.
GO=$(command -v go || true)
[ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
[ -n "$GO" ] || {
    printf 'install-helm: FAILED: go is not on PATH nor in /usr/local/go/bin (Debian: apt-get install golang-go)\n' >&2
    exit 1
}
mkdir -p "$DIR"
printf 'install-helm: building helm %s with go install (Go module proxy)\n' "$VERSION" >&2
# The version is stamped the way Helm's own Makefile does it, so that `helm version` tells the truth.
GOBIN=$DIR CGO_ENABLED=0 "$GO" install \
    -ldflags "-s -w -X helm.sh/helm/$MAJOR/internal/version.version=$VERSION" \
    "helm.sh/helm/$MAJOR/cmd/helm@$VERSION" >&2
"$BIN" version --short >&2
printf '%s\n' "$BIN"
