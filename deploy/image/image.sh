#!/usr/bin/env bash
# The container image without a container registry: podman builds the one Dockerfile on bases made here from
# Debian's packages.
#
#   deploy/image/image.sh tools   install Debian's podman, runc and mmdebstrap when missing (needs root)
#   deploy/image/image.sh bases   make the two base images unless they are there and fresh (below)
#   deploy/image/image.sh build   tools, bases, then `podman build` of the Dockerfile (what `make image` runs)
#   deploy/image/image.sh env     print the variables that make a shell's podman use the project's settings
#
# The bases are Debian bookworm root file systems made by mmdebstrap and turned into images by `podman import`:
#   localhost/outbox-cdc-base:bookworm        the runtime: Debian's essential packages, python3, ca-certificates
#   localhost/outbox-cdc-build-base:bookworm  the build stage's: minbase (apt), python3, python3-venv
# Each is made again when it is missing, older than CDC_IMAGE_BASE_MAX_AGE_DAYS (7: Debian's security updates
# come in), or made by another recipe; CDC_IMAGE_REBUILD_BASES=1 makes them again now. Making one takes about
# 30 s. The root file system tarballs go to a temporary directory outside the checkout and are removed.
#
# podman's settings are deploy/image/containers.conf (CONTAINERS_CONF): runc, cgroupfs, no default ulimits.
# Its storage is podman's own (root: /var/lib/containers/storage), outside the checkout, so that the bases
# and the build's layers are reused by the next build on this machine, from any clone; nothing depends on
# finding them there.
#
# `build` tags localhost/outbox-cdc:latest (CDC_IMAGE to change), writes the image's id to
# .stack/image/id, which the tests run, and prints its size.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/deploy/image/containers.conf}
IMAGE=${CDC_IMAGE:-localhost/outbox-cdc:latest}
BASE=localhost/outbox-cdc-base:bookworm
BUILD_BASE=localhost/outbox-cdc-build-base:bookworm
MAX_AGE_DAYS=${CDC_IMAGE_BASE_MAX_AGE_DAYS:-7}
STATE=$ROOT/.stack/image
BUILD_CA=${CDC_IMAGE_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
SUITE=bookworm
# Documentation, manual pages and translations are left out of both bases (copyright files kept).
DPKG_OPTS=(
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
)
# The merged-usr hook lays out /bin -> usr/bin itself, instead of the usrmerge package (and the perl it
# needs, 50 MB).
MERGED_USR=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
RUNTIME_RECIPE=(--variant=essential --include=python3,ca-certificates)
BUILD_RECIPE=(--variant=minbase --include=python3,python3-venv,ca-certificates)

say() { printf 'image: %s\n' "$*"; }
fail() {
    printf 'image: FAILED: %s\n' "$1" >&2
    [ -n "${2:-}" ] && [ -f "$2" ] && printf 'image: see %s\n' "$2" >&2 && tail -n 20 "$2" >&2
    exit 1
}

cmd_tools() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    [ ${#missing[@]} = 0 ] && return 0
    [ "$(id -u)" = 0 ] || fail "please install Debian's ${missing[*]} (sudo apt-get install -y ${missing[*]})"
    mkdir -p "$STATE"
    say "installing ${missing[*]} from Debian's packages"
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$STATE/apt.log" 2>&1; then
        apt-get update -q >>"$STATE/apt.log" 2>&1 || true
        apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1 ||
            fail "apt-get install ${missing[*]} failed" "$STATE/apt.log"
    fi
}

recipe_key() { printf '%s\n' "$SUITE" "$@" "${DPKG_OPTS[@]}" "${MERGED_USR[@]}" | sha256sum | cut -c1-16; }

# Fresh: there, made by this recipe, and younger than MAX_AGE_DAYS.
base_fresh() {
    local image=$1 key=$2 labels made
    labels=$(podman image inspect --format '{{index .Labels "outbox-cdc.recipe"}} {{index .Labels "outbox-cdc.made"}}' \
        "$image" 2>/dev/null) || return 1
    [ "${labels%% *}" = "$key" ] || return 1
    made=${labels##* }
    [[ $made =~ ^[0-9]+$ ]] && [ $(($(date +%s) - made)) -lt $((MAX_AGE_DAYS * 86400)) ]
}

make_base() {
    local image=$1
    shift
    local key tmp started
    key=$(recipe_key "$@")
    if [ "${CDC_IMAGE_REBUILD_BASES:-0}" != 1 ] && base_fresh "$image" "$key"; then
        say "$image is fresh (recipe $key)"
        return 0
    fi
    mkdir -p "$STATE"
    tmp=$(mktemp -d /var/tmp/outbox-cdc-rootfs.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" RETURN
    started=$(date +%s)
    say "making $image with mmdebstrap $* $SUITE"
    mmdebstrap "$@" "${MERGED_USR[@]}" "${DPKG_OPTS[@]}" "$SUITE" "$tmp/rootfs.tar" >"$STATE/mmdebstrap.log" 2>&1 ||
        fail "mmdebstrap could not make $image" "$STATE/mmdebstrap.log"
    podman import -q \
        --change "LABEL outbox-cdc.recipe=$key" --change "LABEL outbox-cdc.made=$(date +%s)" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$tmp/rootfs.tar" "$image" >/dev/null || fail "podman import of $image failed"
    say "$image made in $(($(date +%s) - started)) s"
}

cmd_bases() {
    make_base "$BASE" "${RUNTIME_RECIPE[@]}"
    make_base "$BUILD_BASE" "${BUILD_RECIPE[@]}"
}

cmd_build() {
    cmd_tools
    cmd_bases
    mkdir -p "$STATE"
    local started size
    started=$(date +%s)
    say "building $IMAGE from $ROOT/Dockerfile"
    # The host's network for RUN steps: apt, pip and cargo reach their registries from there.
    # A proxy that re-signs TLS (this machine's does) is trusted through the host's CA bundle, given as a
    # build secret: used by the RUN that downloads, never stored in a layer.
    local ca=()
    [ -s "$BUILD_CA" ] && ca=(--secret "id=build-ca,src=$BUILD_CA")
    podman build --network=host --layers "${ca[@]}" \
        --build-arg "BASE=$BASE" --build-arg "BUILD_BASE=$BUILD_BASE" \
        --iidfile "$STATE/id.new" -t "$IMAGE" -f "$ROOT/Dockerfile" "$ROOT" >"$STATE/build.log" 2>&1 ||
        fail "podman build failed" "$STATE/build.log"
    mv "$STATE/id.new" "$STATE/id"
    # The untagged images of builds older than a week go. Younger ones stay: they are the layer cache of the
    # next build (a plain prune would empty it, and every build would start from the bases).
    podman image prune -f --filter until=168h >/dev/null 2>&1 || true
    size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    say "built $IMAGE ($(cat "$STATE/id" | cut -c1-19)) in $(($(date +%s) - started)) s: $((size / 1000000)) MB"
}

cmd_env() {
    printf 'export CONTAINERS_CONF=%q\n' "$CONTAINERS_CONF"
}

case "${1:-build}" in
    tools) cmd_tools ;;
    bases) cmd_tools && cmd_bases ;;
    build) cmd_build ;;
    env) cmd_env ;;
    *) fail "usage: $0 tools|bases|build|env" ;;
esac
