#!/usr/bin/env bash
# Build the images of the gateway's Swarm stack (deploy/stack.yaml) from nothing, with no
# container registry, as docker/build.sh builds the kernel image.
#
#   docker/build-stack.sh      from any directory; prints one NAME=TAG line per image
#                              on stdout (logs go to stderr):
#     GATEWAY_STACK_GATEWAY_IMAGE=kernel-gateway:<hash>             the gateway
#     GATEWAY_STACK_LB_IMAGE=kernel-gateway-lb:<hash>               HAProxy in front
#     GATEWAY_STACK_POSTGRES_IMAGE=kernel-gateway-postgres:<hash>   the store
#   (deploy/stack.sh reads them; the kernel image is docker/build.sh's.)
#
# Steps (each one cached):
#   1. base image kernel-gateway-base:bookworm-<packages hash>: if missing, debootstrap a
#      Debian 12 minbase with $BASE_PACKAGES (Python, tini, HAProxy, PostgreSQL 15) from
#      the mirror configured in this machine's apt sources (build.sh's own detection) and
#      `docker import` it. One base for the three images: its layer is stored once. (Not
#      the kernel image's base: that one carries R, and its tag, like the kernel image's,
#      is a hash of its package list, which HAProxy and PostgreSQL would change.)
#   2. each image's tag is a hash of its inputs (its Dockerfile, this script, its files
#      under docker/stack/, the base's tag; the gateway's also pyproject.toml and every
#      file of gateway/ and kernels/); a tag that exists is not built again.
#   3. the gateway's wheelhouse: `pip download` of docker/stack/gateway-requirements.txt
#      (cp311 manylinux x86_64 wheels), cached in $GATEWAY_BUILD_CACHE/stack-wheelhouse-<hash>;
#      the gateway itself is built into a wheel inside the image, offline.
#   4. `docker build --network none` of a temp build context per image.
#
# Environment: GATEWAY_BUILD_CACHE, GATEWAY_DEBIAN_MIRROR, GATEWAY_PIP_CONSTRAINT as for
# docker/build.sh (same defaults).
set -euo pipefail
shopt -s inherit_errexit

export LC_ALL=C

log() { printf '[docker/build-stack.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

# Debian packages of the base; its tag names them, so a changed list is a new base
BASE_PACKAGES=python3,python3-venv,ca-certificates,tini,haproxy,postgresql-15
SUITE=bookworm
BASE=kernel-gateway-base:$SUITE-$(printf '%s' "$BASE_PACKAGES" | sha256sum | cut -c1-8)
CACHE_DIR=${GATEWAY_BUILD_CACHE:-/var/cache/gateway-kernel-build}
WORK=

cleanup() {
    local rc=$?
    [ "$rc" -eq 0 ] || log "failed (exit $rc)"
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        # debootstrap mounts proc/sys inside its target; never rm through a mount.
        local mp
        while read -r mp; do
            umount -l "$mp" 2>/dev/null || true
        done < <(awk -v w="$WORK/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r)
        rm -rf --one-file-system "$WORK" || log "warning: could not remove $WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The mirror detection of docker/build.sh (its "mirror" section), read from it rather than
# copied: build.sh is one of the kernel image's inputs, so it is not edited for this.
# shellcheck source=/dev/null
source <(awk '/^# -+ mirror$/,/^# -+ steps$/' "$SCRIPT_DIR/build.sh")
declare -F detect_mirror >/dev/null || die "docker/build.sh has no detect_mirror any more"

sha_of() { sha256sum < "$REPO_ROOT/$1" | cut -d' ' -f1; }

# NUL-separated, sorted files of the gateway's package and the kernels' (no bytecode).
source_files() {
    (cd "$REPO_ROOT" \
        && find gateway kernels -name __pycache__ -prune -o -type f ! -name '*.pyc' -print0 \
        | sort -z)
}

# source_digest DIR: one hash of the gateway's and the kernels' files under DIR (their
# names and contents), for the repository and for a build context alike.
source_digest() {
    (cd "$1" \
        && find gateway kernels -name __pycache__ -prune -o -type f ! -name '*.pyc' -print0 \
        | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}
SOURCES_DIGEST=

# hash_of KIND FILE...: the hash naming an image: these files, this script, the base.
hash_of() {
    local kind=$1 f
    shift
    {
        printf 'KIND\0%s\nBASE\0%s\n' "$kind" "$BASE"
        for f in docker/build-stack.sh "$@"; do
            [ -f "$REPO_ROOT/$f" ] || die "missing $f"
            printf '%s\0%s\n' "$f" "$(sha_of "$f")"
        done
        if [ "$kind" = gateway ]; then
            printf 'SOURCES\0%s\n' "$SOURCES_DIGEST"
        fi
    } | sha256sum | cut -c1-16
}

GATEWAY_FILES=(docker/gateway.Dockerfile docker/stack/gateway-requirements.txt
    docker/stack/gateway-entrypoint.sh docker/stack/healthcheck.py pyproject.toml)
LB_FILES=(docker/lb.Dockerfile docker/stack/lb-entrypoint.sh docker/stack/healthcheck.py)
POSTGRES_FILES=(docker/postgres.Dockerfile docker/stack/postgres-entrypoint.sh)

ensure_base_image() {
    if docker image inspect "$BASE" >/dev/null 2>&1; then
        log "base image $BASE present"
        return 0
    fi
    command -v debootstrap >/dev/null 2>&1 \
        || die "debootstrap not found (apt-get install debootstrap, or run .ci/docker-up.sh)"
    local mirror rootfs=$WORK/rootfs t0=$SECONDS
    mirror=$(detect_mirror) \
        || die "no Debian mirror found in /etc/apt/sources.list{,.d/*.sources}; set GATEWAY_DEBIAN_MIRROR"
    log "base image $BASE missing: debootstrap $SUITE from $mirror"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$mirror" >&2 || {
        [ ! -f "$rootfs/debootstrap/debootstrap.log" ] \
            || tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
        die "debootstrap failed"
    }
    log "debootstrap took $((SECONDS - t0)) s"
    find "$rootfs/var/cache/apt" "$rootfs/var/lib/apt/lists" -type f -delete 2>/dev/null || true
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} + 2>/dev/null || true
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete 2>/dev/null || true
    find "$rootfs/usr/share/doc" -mindepth 1 -depth -type d -empty -delete 2>/dev/null || true
    # the cluster the package made for itself: the store image makes its own at first start
    rm -rf "$rootfs"/var/lib/postgresql/15 "$rootfs"/etc/postgresql/15
    # PostgreSQL's JIT (LLVM and z3, 130 MB, loaded only with jit=on): the store runs with
    # jit=off (postgres-entrypoint.sh); nothing else links them
    rm -f "$rootfs"/usr/lib/x86_64-linux-gnu/libLLVM-*.so* "$rootfs"/usr/lib/x86_64-linux-gnu/libz3.so*
    rm -rf "$rootfs"/usr/lib/postgresql/15/lib/llvmjit* "$rootfs"/usr/lib/postgresql/15/lib/bitcode
    rm -f "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"
    tar --numeric-owner -C "$rootfs" \
        --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
        | docker import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'LABEL org.opencontainers.image.title=kernel-gateway-base' \
            --change 'CMD ["/bin/bash"]' \
            - "$BASE" >&2
    rm -rf --one-file-system "$rootfs"
    log "base image $BASE made in $((SECONDS - t0)) s"
}

# Prints the wheelhouse directory of the gateway's requirements.
ensure_wheelhouse() {
    local req=$REPO_ROOT/docker/stack/gateway-requirements.txt wheelhouse tmp t0=$SECONDS
    wheelhouse=$CACHE_DIR/stack-wheelhouse-$(sha_of docker/stack/gateway-requirements.txt | cut -c1-16)
    if [ -d "$wheelhouse" ]; then
        log "wheelhouse cached: $wheelhouse"
    else
        python3 -m pip --version >/dev/null 2>&1 || die "no pip on the host (python3 -m pip)"
        tmp=$(mktemp -d "$CACHE_DIR/.stack-wheelhouse.XXXXXX")
        log "downloading the gateway's wheels into $tmp"
        if ! PIP_CONSTRAINT=${GATEWAY_PIP_CONSTRAINT:-/dev/null} \
            PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
            python3 -m pip download -r "$req" \
                --only-binary=:all: --python-version 3.11 \
                --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
                --platform manylinux_2_17_x86_64 -d "$tmp" >&2; then
            rm -rf "$tmp"
            die "pip download failed"
        fi
        chmod 0755 "$tmp"
        mv -T "$tmp" "$wheelhouse"
        log "wheelhouse ready in $((SECONDS - t0)) s: $wheelhouse"
    fi
    printf '%s\n' "$wheelhouse"
}

# build TAG CONTEXT: `docker build --network none` of CONTEXT/Dockerfile as TAG.
build() {
    local tag=$1 ctx=$2 t0=$SECONDS
    log "building $tag FROM $BASE"
    DOCKER_BUILDKIT=0 docker build --network none --force-rm \
        --build-arg "BASE=$BASE" \
        --label "kernel-gateway.inputs-sha256=${tag##*:}" \
        -t "$tag" -f "$ctx/Dockerfile" "$ctx" >&2
    log "built $tag in $((SECONDS - t0)) s"
}

# context KIND: a fresh build context for KIND (its Dockerfile and files), printed.
context() {
    local kind=$1 ctx=$WORK/$1
    mkdir -p "$ctx"
    cp "$REPO_ROOT/docker/$kind.Dockerfile" "$ctx/Dockerfile"
    cp "$REPO_ROOT/docker/stack/healthcheck.py" "$ctx/"
    case "$kind" in
        gateway)
            local wheelhouse
            wheelhouse=$(ensure_wheelhouse)
            mkdir -p "$ctx/wheelhouse" "$ctx/src"
            cp -l "$wheelhouse"/*.whl "$ctx/wheelhouse/" 2>/dev/null \
                || cp "$wheelhouse"/*.whl "$ctx/wheelhouse/"
            cp "$REPO_ROOT/docker/stack/gateway-requirements.txt" "$ctx/requirements.txt"
            cp "$REPO_ROOT/docker/stack/gateway-entrypoint.sh" "$ctx/entrypoint.sh"
            cp "$REPO_ROOT/pyproject.toml" "$ctx/src/"
            # pyproject.toml names a readme; the repository's would make every edit of it
            # a new image
            printf '# kernel-gateway\n\nSee the repository README.\n' > "$ctx/src/README.md"
            source_files | tar -C "$REPO_ROOT" --null -T - -cf - | tar -C "$ctx/src" -xf -
            # what is built is what the tag names: sources edited between the hash and this
            # copy would give an image a tag of other sources
            [ "$(source_digest "$ctx/src")" = "$SOURCES_DIGEST" ] \
                || die "gateway/ or kernels/ changed while the image was being built; run again"
            ;;
        lb) cp "$REPO_ROOT/docker/stack/lb-entrypoint.sh" "$ctx/entrypoint.sh" ;;
        postgres) cp "$REPO_ROOT/docker/stack/postgres-entrypoint.sh" "$ctx/entrypoint.sh" ;;
    esac
    printf '%s\n' "$ctx"
}

main() {
    [ $# -eq 0 ] || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }
    command -v docker >/dev/null 2>&1 || die "docker CLI not found"
    docker info >/dev/null 2>&1 || die "docker does not answer (start it, e.g. .ci/docker-up.sh)"
    local -A tags=()
    local kind ctx missing=() t0=$SECONDS
    SOURCES_DIGEST=$(source_digest "$REPO_ROOT")
    tags[gateway]=kernel-gateway:$(hash_of gateway "${GATEWAY_FILES[@]}")
    tags[lb]=kernel-gateway-lb:$(hash_of lb "${LB_FILES[@]}")
    tags[postgres]=kernel-gateway-postgres:$(hash_of postgres "${POSTGRES_FILES[@]}")
    for kind in postgres lb gateway; do
        docker image inspect "${tags[$kind]}" >/dev/null 2>&1 || missing+=("$kind")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR (set GATEWAY_BUILD_CACHE)"
        exec 9>>"$CACHE_DIR/.stack-lock"  # one build at a time per cache directory
        ! command -v flock >/dev/null 2>&1 || flock 9
        WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/kernel-gateway-stack-build.XXXXXX")
        for kind in "${missing[@]}"; do
            if docker image inspect "${tags[$kind]}" >/dev/null 2>&1; then
                log "image ${tags[$kind]} was built meanwhile"
                continue
            fi
            ensure_base_image
            ctx=$(context "$kind")
            build "${tags[$kind]}" "$ctx"
        done
        log "done in $((SECONDS - t0)) s"
    else
        log "images exist; nothing to build"
    fi
    printf 'GATEWAY_STACK_GATEWAY_IMAGE=%s\n' "${tags[gateway]}"
    printf 'GATEWAY_STACK_LB_IMAGE=%s\n' "${tags[lb]}"
    printf 'GATEWAY_STACK_POSTGRES_IMAGE=%s\n' "${tags[postgres]}"
}

main "$@"
