#!/usr/bin/env bash
# Build the gateway's kernel image from nothing, with no container registry.
#
#   docker/build.sh [--profile minimal|datascience] [--extra-requirements FILE]
#       from any directory; prints the tag as the last stdout line
#
# Profiles (README.md, "The Docker backend": what each holds, its size and build time):
#   minimal      Python (ipykernel, numpy, pandas, matplotlib), bash, JavaScript and
#                TypeScript (Deno): docker/requirements.txt
#   datascience  (the default) minimal and the scientific stack,
#                docker/requirements-datascience.txt, and R through IRkernel from
#                Debian's packages ($R_PACKAGES), in the base
# --extra-requirements FILE: an operator's own pinned requirements (one per line; no pip
#   options), downloaded as wheels with the profile's and installed with them, offline;
#   the file's content is part of the input hash.
#
# Steps (each one cached):
#   1. input hash over docker/Dockerfile, docker/requirements*.txt, docker/build.sh,
#      the profile, the extra requirements and every file under kernels/ (no
#      __pycache__, *.pyc); tag gateway-kernel:<first 16 hex>. If that tag exists: no
#      build.
#   2. base image gateway-kernel-base:bookworm-<packages hash>: if missing, debootstrap
#      a Debian 12 minbase ($BASE_PACKAGES: python3, python3-venv, ca-certificates,
#      tini, git — bash runs get git, as code_run's manual promises — and the
#      profile's Debian packages: R for datascience) from the mirror configured in
#      this machine's apt sources and `docker import` it.
#   3. wheelhouse: `pip download` of the profile's requirements and the extra ones
#      (cp311, manylinux x86_64 wheels only; each manylinux tag is named: pip does not
#      take a manylinux_2_27 wheel such as deno's for manylinux_2_28), cached in
#      $GATEWAY_BUILD_CACHE/wheelhouse-<hash of the requirements>.
#   4. `docker build --network none` of a temp build context; the image lists what it
#      holds in /opt/gateway/environment.json (`python -m kernels.environment`).
#   The result is also tagged gateway-kernel:<profile> and gateway-kernel:latest.
#
# Environment:
#   GATEWAY_IMAGE_BASE      base image to build FROM (e.g. python:3.11-slim on a
#                           machine with a registry); when set, no debootstrap.
#                           A non-default base is part of the input hash.
#   GATEWAY_BUILD_CACHE     cache directory (default /var/cache/gateway-kernel-build)
#   GATEWAY_DEBIAN_MIRROR   Debian mirror URL for debootstrap (default: read
#                           from /etc/apt/sources.list{,.d/*.sources})
#   GATEWAY_PIP_CONSTRAINT  pip constraint file for the download (default
#                           /dev/null: the host's pip constraint file, if any,
#                           must not shape the image; requirements are pinned)
#   GATEWAY_IMAGE_PROFILE   the profile when --profile is not given (default datascience)
#   GATEWAY_BUILD_NO_CACHE  1: `docker build --no-cache` (no layer of an earlier build is
#                           reused; the base and the wheelhouse still are)
#
# Logs go to stderr; stdout carries only the final tag.
set -euo pipefail
shopt -s inherit_errexit

export LC_ALL=C

log() { printf '[docker/build.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

IMAGE_NAME=gateway-kernel
# Debian packages of the base; the base's tag names them, so a changed list is a new base
BASE_PACKAGES=python3,python3-venv,ca-certificates,tini,git
# R and IRkernel, ggplot2 and jsonlite (the kernel's `result`), from Debian: CRAN is not
# reachable from the machines that build the image
R_PACKAGES=r-base-core,r-cran-irkernel,r-cran-ggplot2,r-cran-jsonlite
PROFILES="minimal datascience"
PROFILE=${GATEWAY_IMAGE_PROFILE:-datascience}
EXTRA_REQUIREMENTS=
SUITE=bookworm
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

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
}

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --profile) [ $# -ge 2 ] || die "--profile needs a name"; PROFILE=$2; shift 2 ;;
            --profile=*) PROFILE=${1#*=}; shift ;;
            --extra-requirements)
                [ $# -ge 2 ] || die "--extra-requirements needs a file"
                EXTRA_REQUIREMENTS=$2; shift 2 ;;
            --extra-requirements=*) EXTRA_REQUIREMENTS=${1#*=}; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done
    case " $PROFILES " in
        *" $PROFILE "*) ;;
        *) die "unknown profile '$PROFILE' (one of: $PROFILES)" ;;
    esac
    if [ -n "$EXTRA_REQUIREMENTS" ]; then
        [ -f "$EXTRA_REQUIREMENTS" ] && [ -r "$EXTRA_REQUIREMENTS" ] \
            || die "cannot read the extra requirements file $EXTRA_REQUIREMENTS"
        # pins only: an option (-r, -c, --index-url, ...) would reach files or indexes
        # outside the input hash
        if grep -nE '^[[:space:]]*-' "$EXTRA_REQUIREMENTS" >&2; then
            die "$EXTRA_REQUIREMENTS: pip options are not allowed, only requirements (above)"
        fi
    fi
}

# The profile's requirements file, relative to the repo root.
profile_requirements() {
    case "$PROFILE" in
        minimal) echo docker/requirements.txt ;;
        *) echo "docker/requirements-$PROFILE.txt" ;;
    esac
}

# The profile's Debian packages besides $BASE_PACKAGES (comma-separated, may be empty).
profile_debian_packages() {
    case "$PROFILE" in
        datascience) echo "$R_PACKAGES" ;;
        *) echo "" ;;
    esac
}

# The languages the image must have (checked when it is built).
profile_languages() {
    case "$PROFILE" in
        datascience) echo python,bash,javascript,typescript,r ;;
        *) echo python,bash,javascript,typescript ;;
    esac
}

set_base() {
    local packages=$BASE_PACKAGES extra
    extra=$(profile_debian_packages)
    [ -z "$extra" ] || packages=$packages,$extra
    BASE_PACKAGES=$packages
    DEFAULT_BASE=gateway-kernel-base:bookworm-$(printf '%s' "$BASE_PACKAGES" | sha256sum | cut -c1-8)
    BASE=${GATEWAY_IMAGE_BASE:-$DEFAULT_BASE}
}

# ------------------------------------------------------------------ inputs
# NUL-separated, sorted list of kernels/ files, relative to the repo root.
kernel_files() {
    [ -d "$REPO_ROOT/kernels" ] || return 0
    (cd "$REPO_ROOT" \
        && find kernels -name __pycache__ -prune -o -type f ! -name '*.pyc' -print0 \
        | sort -z)
}

# NUL-separated, sorted list of docker/requirements*.txt, relative to the repo root.
requirement_files() {
    (cd "$REPO_ROOT" && find docker -maxdepth 1 -name 'requirements*.txt' -print0 | sort -z)
}

input_hash() {
    local f
    {
        for f in docker/Dockerfile docker/build.sh "$(profile_requirements)"; do
            [ -f "$REPO_ROOT/$f" ] || die "missing $f"
        done
        for f in docker/Dockerfile docker/build.sh; do
            printf '%s\0%s\n' "$f" "$(sha256sum < "$REPO_ROOT/$f" | cut -d' ' -f1)"
        done
        while IFS= read -r -d '' f; do
            printf '%s\0%s\n' "$f" "$(sha256sum < "$REPO_ROOT/$f" | cut -d' ' -f1)"
        done < <(requirement_files; kernel_files)
        printf 'PROFILE\0%s\n' "$PROFILE"
        printf 'PACKAGES\0%s\n' "$BASE_PACKAGES"
        if [ -n "$EXTRA_REQUIREMENTS" ]; then
            printf 'EXTRA\0%s\n' "$(sha256sum < "$EXTRA_REQUIREMENTS" | cut -d' ' -f1)"
        fi
        if [ "$BASE" != "$DEFAULT_BASE" ]; then
            printf 'BASE\0%s\n' "$BASE"
        fi
    } | sha256sum | cut -d' ' -f1
}

# ------------------------------------------------------------------ mirror
# Candidate "URL<TAB>suites" lines from the apt sources, in file order.
apt_source_candidates() {
    local f
    if [ -f /etc/apt/sources.list ]; then
        awk '
            { sub(/#.*/, "") }
            $1 == "deb" {
                line = $0
                gsub(/\[[^]]*\]/, " ", line)      # drop [ options ]
                n = split(line, w, /[ \t]+/)
                k = 0
                for (i = 1; i <= n; i++) if (w[i] != "") v[++k] = w[i]
                if (k >= 3) print v[2] "\t" v[3]
            }' /etc/apt/sources.list
    fi
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
            function flush(   n, i, u) {
                if (uris != "" && (" " types " ") ~ / deb / && enabled != "no") {
                    n = split(uris, u, /[ \t]+/)
                    for (i = 1; i <= n; i++) if (u[i] != "") print u[i] "\t" suites
                }
                types = ""; uris = ""; suites = ""; enabled = "yes"; key = ""
            }
            BEGIN { enabled = "yes" }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]/ {                               # continuation line
                v = $0; gsub(/^[ \t]+|[ \t]+$/, "", v)
                if (key == "types") types = types " " v
                else if (key == "uris") uris = uris " " v
                else if (key == "suites") suites = suites " " v
                next
            }
            {
                k = $0; sub(/:.*/, "", k); key = tolower(k)
                v = $0; sub(/^[^:]*:/, "", v); gsub(/^[ \t]+|[ \t]+$/, "", v)
                if (key == "types") types = v
                else if (key == "uris") uris = v
                else if (key == "suites") suites = v
                else if (key == "enabled") enabled = tolower(v)
            }
            END { flush() }' "$f"
    done
}

# The main Debian archive: the first non-security URL that serves $SUITE,
# else the first non-security URL at all.
detect_mirror() {
    if [ -n "${GATEWAY_DEBIAN_MIRROR:-}" ]; then
        printf '%s\n' "$GATEWAY_DEBIAN_MIRROR"
        return 0
    fi
    local url suites s fallback=
    while IFS=$'\t' read -r url suites; do
        case "$url" in
            http://*|https://*|ftp://*|file:/*) ;;
            *) continue ;;
        esac
        case "$url" in *security*) continue ;; esac
        for s in $suites; do
            case "$s" in *security*) continue 2 ;; esac
        done
        [ -n "$fallback" ] || fallback=$url
        for s in $suites; do
            if [ "$s" = "$SUITE" ]; then
                printf '%s\n' "$url"
                return 0
            fi
        done
    done < <(apt_source_candidates)
    [ -n "$fallback" ] || return 1
    printf '%s\n' "$fallback"
}

# ------------------------------------------------------------------ steps
ensure_base_image() {
    if docker image inspect "$BASE" >/dev/null 2>&1; then
        log "base image $BASE present"
        return 0
    fi
    if [ "$BASE" != "$DEFAULT_BASE" ]; then
        log "base image $BASE not present locally; docker build will try to pull it"
        return 0
    fi
    command -v debootstrap >/dev/null 2>&1 \
        || die "debootstrap not found (apt-get install debootstrap, or run .ci/docker-up.sh)"
    local mirror rootfs t0
    mirror=$(detect_mirror) \
        || die "no Debian mirror found in /etc/apt/sources.list{,.d/*.sources}; set GATEWAY_DEBIAN_MIRROR"
    rootfs=$WORK/rootfs
    log "base image $BASE missing: debootstrap $SUITE from $mirror"
    t0=$SECONDS
    debootstrap --variant=minbase \
        --include="$BASE_PACKAGES" \
        "$SUITE" "$rootfs" "$mirror" >&2 || {
        if [ -f "$rootfs/debootstrap/debootstrap.log" ]; then
            log "tail of debootstrap.log:"
            tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
        fi
        die "debootstrap failed"
    }
    log "debootstrap took $((SECONDS - t0)) s"
    # Trim what an image need not carry: downloaded .debs, apt lists, the
    # host's resolv.conf/hostname (Docker provides its own at run time).
    find "$rootfs/var/cache/apt" "$rootfs/var/lib/apt/lists" -type f -delete 2>/dev/null || true
    # Translations, man/info pages and docs (~50 MB); copyright files stay.
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} + 2>/dev/null || true
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete 2>/dev/null || true
    find "$rootfs/usr/share/doc" -mindepth 1 -depth -type d -empty -delete 2>/dev/null || true
    rm -f "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"
    log "importing $rootfs as $BASE"
    tar --numeric-owner -C "$rootfs" \
        --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
        -c . \
        | docker import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'LABEL org.opencontainers.image.title=gateway-kernel-base' \
            --change 'CMD ["/bin/bash"]' \
            - "$BASE" >&2
    rm -rf --one-file-system "$rootfs"
}

pip_cmd() {
    if python3 -m pip --version >/dev/null 2>&1; then
        echo "python3 -m pip"
    elif command -v pip3 >/dev/null 2>&1; then
        echo pip3
    elif command -v pip >/dev/null 2>&1; then
        echo pip
    else
        return 1
    fi
}

# The hash that names a wheelhouse: every requirements file pip reads for this build.
wheelhouse_hash() {
    local f
    {
        while IFS= read -r -d '' f; do
            printf '%s\0%s\n' "$f" "$(sha256sum < "$REPO_ROOT/$f" | cut -d' ' -f1)"
        done < <(requirement_files)
        printf 'PROFILE\0%s\n' "$PROFILE"
        if [ -n "$EXTRA_REQUIREMENTS" ]; then
            printf 'EXTRA\0%s\n' "$(sha256sum < "$EXTRA_REQUIREMENTS" | cut -d' ' -f1)"
        fi
    } | sha256sum | cut -c1-16
}

# Prints the wheelhouse directory.
ensure_wheelhouse() {
    local req=$REPO_ROOT/$(profile_requirements) req_hash wheelhouse tmp pip t0
    local -a extra=()
    [ -z "$EXTRA_REQUIREMENTS" ] || extra=(-r "$EXTRA_REQUIREMENTS")
    req_hash=$(wheelhouse_hash)
    wheelhouse=$CACHE_DIR/wheelhouse-$req_hash
    if [ -d "$wheelhouse" ]; then
        log "wheelhouse cached: $wheelhouse"
    else
        t0=$SECONDS
        pip=$(pip_cmd) || die "no pip on the host to download wheels with"
        tmp=$(mktemp -d "$CACHE_DIR/.wheelhouse-$req_hash.XXXXXX")
        log "downloading wheels into $tmp ($pip)"
        if ! PIP_CONSTRAINT=${GATEWAY_PIP_CONSTRAINT:-/dev/null} \
            PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
            $pip download -r "$req" "${extra[@]}" \
                --only-binary=:all: \
                --python-version 3.11 \
                --platform manylinux2014_x86_64 \
                --platform manylinux_2_28_x86_64 \
                --platform manylinux_2_27_x86_64 \
                --platform manylinux_2_17_x86_64 \
                -d "$tmp" >&2; then
            rm -rf "$tmp"
            die "pip download failed"
        fi
        chmod 0755 "$tmp"
        mv -T "$tmp" "$wheelhouse"
        log "wheelhouse ready in $((SECONDS - t0)) s: $wheelhouse ($(find "$wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sm "$wheelhouse" | cut -f1) MB)"
    fi
    printf '%s\n' "$wheelhouse"
}

assemble_context() {
    local ctx=$1 wheelhouse=$2 f
    mkdir -p "$ctx/kernels" "$ctx/wheelhouse" "$ctx/requirements"
    cp "$REPO_ROOT/docker/Dockerfile" "$ctx/"
    while IFS= read -r -d '' f; do
        cp "$REPO_ROOT/$f" "$ctx/requirements/"
    done < <(requirement_files)
    # what the image installs: the profile's requirements, and the operator's
    cp "$REPO_ROOT/$(profile_requirements)" "$ctx/requirements/profile.txt"
    if [ -n "$EXTRA_REQUIREMENTS" ]; then
        cp "$EXTRA_REQUIREMENTS" "$ctx/requirements/extra.txt"
    else
        : > "$ctx/requirements/extra.txt"
    fi
    # hard links where the cache and the context share a file system (seconds, not a copy)
    cp -l "$wheelhouse"/*.whl "$ctx/wheelhouse/" 2>/dev/null || cp "$wheelhouse"/*.whl "$ctx/wheelhouse/"
    if [ -d "$REPO_ROOT/kernels" ]; then
        kernel_files | tar -C "$REPO_ROOT" --null -T - -cf - | tar -C "$ctx" -xf -
    fi
}

# ------------------------------------------------------------------ main
main() {
    parse_args "$@"
    set_base
    command -v docker >/dev/null 2>&1 || die "docker CLI not found"
    docker info >/dev/null 2>&1 || die "docker does not answer (start it, e.g. .ci/docker-up.sh)"

    local hash tag t0 wheelhouse
    hash=$(input_hash)
    tag=$IMAGE_NAME:${hash:0:16}

    if docker image inspect "$tag" >/dev/null 2>&1; then
        log "image $tag exists; nothing to build"
    else
        t0=$SECONDS
        mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR (set GATEWAY_BUILD_CACHE)"
        # One build at a time per cache directory (base image, wheelhouse, tag).
        exec 9>>"$CACHE_DIR/.lock"
        if command -v flock >/dev/null 2>&1; then
            flock 9
        fi
        if docker image inspect "$tag" >/dev/null 2>&1; then
            log "image $tag was built meanwhile"
        else
            WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/gateway-kernel-build.XXXXXX")
            ensure_base_image
            wheelhouse=$(ensure_wheelhouse)
            assemble_context "$WORK/context" "$wheelhouse"
            log "building $tag ($PROFILE) FROM $BASE, $((SECONDS - t0)) s so far"
            local -a no_cache=()
            [ "${GATEWAY_BUILD_NO_CACHE:-0}" != 1 ] || no_cache=(--no-cache)
            DOCKER_BUILDKIT=0 docker build "${no_cache[@]}" \
                --network none \
                --force-rm \
                --build-arg "BASE=$BASE" \
                --build-arg "PROFILE=$PROFILE" \
                --build-arg "LANGUAGES=$(profile_languages)" \
                --label "gateway-kernel.inputs-sha256=$hash" \
                --label "gateway-kernel.profile=$PROFILE" \
                -t "$tag" \
                -f "$WORK/context/Dockerfile" \
                "$WORK/context" >&2
            log "built $tag in $((SECONDS - t0)) s"
        fi
    fi

    docker tag "$tag" "$IMAGE_NAME:$PROFILE"
    docker tag "$tag" "$IMAGE_NAME:latest"
    printf '%s\n' "$tag"
}

main "$@"
