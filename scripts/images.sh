#!/usr/bin/env bash
# `make images`: the service images from deploy/Dockerfile, built with Podman
# where no registry can be reached.
#
#   scripts/images.sh            base images (cached), then api, transcoder, webhook-dispatcher, ingest, playback, then check
#   scripts/images.sh base       only the local base images and stand-ins
#   scripts/images.sh compose    the runtime base, clamd and the Compose stack's stand-ins (postgres, rabbitmq, garage, curl)
#   scripts/images.sh check      what the built images contain (sizes, user, no compiler or headers;
#                                FFmpeg libraries in the transcoder only, so none in playback)
#
# Base images (cached under .local/images/, rebuilt only when missing):
#   localhost/vid-base/debian:bookworm-slim   debootstrap --variant=minbase bookworm, slimmed like
#                                             debian:bookworm-slim (no docs, man pages, locales, apt lists)
#   localhost/vid-base/rust:1.95-bookworm     that + gcc/g++/make/git + this machine's Rust toolchain
#                                             (deploy/local/images/rust-builder.Containerfile)
#   localhost/vid-local/clamav:1.4.6          stand-in for clamav/clamav (deploy/local/images/clamav.Containerfile)
# The Dockerfile takes them as build arguments (RUST_IMAGE/RUST_TAG, RUNTIME_IMAGE/RUNTIME_TAG); its
# defaults stay the production ones. apt inside the build reaches Debian's
# archive only; cargo reaches crates.io only; no image is pulled (--pull=never).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh

CACHE="$ROOT/.local/images"
# Logs go here too, also when the base images exist already (a fresh clone on a machine that built them).
mkdir -p "$CACHE"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_RUNTIME=localhost/vid-base/debian:bookworm-slim
BASE_RUST=localhost/vid-base/rust:1.95-bookworm
RUST_TOOLCHAIN_DIR="${RUST_TOOLCHAIN_DIR:-$(rustc --print sysroot)}"
SERVICES=(api transcoder webhook-dispatcher ingest playback)
TAG="${VID_IMAGE_TAG:-local}"

log() { printf 'images: %s\n' "$*"; }
have_image() { podman image exists "$1"; }

# debootstrap once; the tar under .local/images/ survives `podman system reset`.
base_runtime() {
    have_image "$BASE_RUNTIME" && { log "$BASE_RUNTIME present"; return; }
    local tarball="$CACHE/debian-bookworm-slim.tar"
    if [ ! -s "$tarball" ]; then
        local rootfs="$CACHE/rootfs-bookworm"
        rm -rf "$rootfs"; mkdir -p "$CACHE"
        log "debootstrap bookworm (minbase) from $DEBIAN_MIRROR"
        debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$DEBIAN_MIRROR" \
            >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
        # What debian:bookworm-slim drops, and keeps dropping for later apt installs.
        cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
        printf 'APT::Install-Recommends "false";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
        find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
        rm -rf "$rootfs"/usr/share/{man,info,locale,groff,lintian}/* "$rootfs"/var/lib/apt/lists/* \
               "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
        tar -C "$rootfs" --numeric-owner -cf "$tarball" .
        rm -rf "$rootfs"
    fi
    log "podman import $tarball as $BASE_RUNTIME"
    podman import -q --change 'CMD ["bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$tarball" "$BASE_RUNTIME" >/dev/null
}

# The builder base: no rustup download, the toolchain is this machine's.
base_rust() {
    have_image "$BASE_RUST" && { log "$BASE_RUST present"; return; }
    local ctx="$CACHE/builder-context"
    rm -rf "$ctx"; mkdir -p "$ctx/toolchain"
    # Hard links where possible: the context is a view of the toolchain, not a copy.
    # share/ (docs, man pages) is left out.
    for d in bin lib libexec etc; do
        [ -d "$RUST_TOOLCHAIN_DIR/$d" ] || continue
        cp -al "$RUST_TOOLCHAIN_DIR/$d" "$ctx/toolchain/" 2>/dev/null || cp -a "$RUST_TOOLCHAIN_DIR/$d" "$ctx/toolchain/"
    done
    # The CA bundle this machine's own cargo trusts (crates.io is reached through it).
    cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca-bundle.crt"
    log "building $BASE_RUST with the toolchain of $RUST_TOOLCHAIN_DIR ($(rustc --version))"
    podman build --pull=never --network host -q \
        --build-arg BASE_IMAGE="$BASE_RUNTIME" \
        -f "$ROOT/deploy/local/images/rust-builder.Containerfile" -t "$BASE_RUST" "$ctx" >/dev/null
    rm -rf "$ctx"
}

# Stand-ins for the third-party images the manifests name (clamd sidecar).
standins() {
    local img=localhost/vid-local/clamav:1.4.6
    have_image "$img" && { log "$img present"; return; }
    log "building $img (Debian's clamav-daemon, EICAR test signatures)"
    podman build --pull=never --network host -q --build-arg BASE_IMAGE="$BASE_RUNTIME" \
        -f deploy/local/images/clamav.Containerfile -t "$img" deploy/local/images >/dev/null
}

# Stand-ins for the Compose stack's third-party images (deploy/docker-compose.podman.yml
# names them), built only for `scripts/images.sh compose` (scripts/compose-test.sh):
#   localhost/vid-local/postgres:15-bookworm       Debian's postgresql-15, the official image's env interface
#   localhost/vid-local/rabbitmq:3.10-management   Debian's rabbitmq-server 3.10, management plugin on
#   localhost/vid-local/garage:v2.5.0              the ~/.cargo/bin/garage that `scripts/stack.sh infra-up` installs
#   localhost/vid-local/curl:7.88-bookworm         Debian's curl, for the garage-init job
# Each is rebuilt only when missing (podman rmi it to rebuild); build logs in .local/images/.
COMPOSE_STANDINS=(postgres:15-bookworm rabbitmq:3.10-management curl:7.88-bookworm garage:v2.5.0)
GARAGE_BIN="${GARAGE_BIN:-$HOME/.cargo/bin/garage}"
compose_standin() {   # compose_standin NAME:TAG
    local name="${1%%:*}" img="localhost/vid-local/$1" ctx="$ROOT/deploy/local/images" start=$SECONDS
    have_image "$img" && { log "$img present"; return; }
    if [ "$name" = garage ]; then
        [ -x "$GARAGE_BIN" ] || { echo "images: $GARAGE_BIN missing: run 'scripts/stack.sh infra-up' (make infra) first, it installs Garage" >&2; return 1; }
        # `garage cargo:2.5.0 [...]` (cargo install) or `garage v2.5.0 [...]` (release builds).
        [[ "$("$GARAGE_BIN" --version)" =~ ^garage\ (cargo:|v)${1##*:v}\  ]] ||
            { echo "images: $GARAGE_BIN is '$("$GARAGE_BIN" --version)', the tag says ${1##*:}" >&2; return 1; }
        ctx="$CACHE/garage-context"; rm -rf "$ctx"; mkdir -p "$ctx"
        cp -l "$GARAGE_BIN" "$ctx/garage" 2>/dev/null || cp "$GARAGE_BIN" "$ctx/garage"
        cp "$ROOT/deploy/local/images/garage.Containerfile" "$ctx/"
    fi
    log "building $img (deploy/local/images/$name.Containerfile)"
    podman build --pull=never --network host --format docker --build-arg BASE_IMAGE="$BASE_RUNTIME" \
        -f "$ctx/$name.Containerfile" -t "$img" "$ctx" >"$CACHE/build-$name.log" 2>&1 ||
        { tail -30 "$CACHE/build-$name.log" >&2; return 1; }
    [ "$name" != garage ] || rm -rf "$ctx"
    log "$img built in $((SECONDS - start)) s, $(( $(podman image inspect --format '{{.Size}}' "$img") / 1000000 )) MB"
}
compose_standins() {
    local s; for s in "${COMPOSE_STANDINS[@]}"; do compose_standin "$s"; done
}

build_service() {
    local svc="$1"
    log "building localhost/vid/$svc:$TAG (deploy/Dockerfile --target $svc)"
    # docker format: OCI images have no HEALTHCHECK, the Dockerfile's would be dropped.
    podman build --pull=never --network host --format docker \
        --build-arg RUST_IMAGE="${BASE_RUST%:*}" --build-arg RUST_TAG="${BASE_RUST##*:}" \
        --build-arg RUNTIME_IMAGE="${BASE_RUNTIME%:*}" --build-arg RUNTIME_TAG="${BASE_RUNTIME##*:}" \
        -f deploy/Dockerfile --target "$svc" -t "localhost/vid/$svc:$TAG" . \
        >"$CACHE/build-$svc.log" 2>&1 || { tail -40 "$CACHE/build-$svc.log" >&2; return 1; }
}

# What an image must and must not contain, asked of the image itself.
check_image() {
    local svc="$1" img="localhost/vid/$1:$TAG" bad=0 out
    local size user
    size="$(podman image inspect --format '{{.Size}}' "$img")"
    user="$(podman image inspect --format '{{.Config.User}}' "$img")"
    # As root inside the image only to read it: dpkg's view plus a filesystem scan.
    out="$(podman run --rm --pull=never --no-healthcheck --user 0 --entrypoint bash "$img" -c '
        dpkg-query -W -f="\${Package}\n" | grep -E "^((gcc|g\+\+|cpp|clang|llvm)(-[0-9]+)?|libclang.*|binutils.*|libc6-dev|make|pkg-?conf(ig)?|rustc|cargo)$|-dev$" | sed "s/^/package: /"
        for t in cc gcc g++ clang ld as rustc cargo make; do command -v "$t" >/dev/null && echo "tool: $t"; done
        [ -d /usr/include ] && find /usr/include -name "*.h" | head -3 | sed "s/^/header: /"
        ldd /usr/local/bin/* | grep "not found" | sed "s/^/missing lib: /"
        echo "libav: $(ls /usr/lib/x86_64-linux-gnu | grep -cE "^lib(avcodec|avformat|avutil|swscale)\.so\.")"
    ')"
    if grep -E '^(package|tool|header|missing lib):' <<<"$out"; then bad=1; fi
    local libav; libav="$(sed -n 's/^libav: //p' <<<"$out")"
    if [ "$svc" = transcoder ]; then
        [ "$libav" -ge 4 ] || { echo "$img: FFmpeg runtime libraries missing"; bad=1; }
    else
        [ "$libav" -eq 0 ] || { echo "$img: has FFmpeg libraries it does not use"; bad=1; }
    fi
    [ "$user" = 10001:10001 ] || { echo "$img: USER is '$user', want 10001:10001"; bad=1; }
    printf 'images: %-38s %4d MB  user %s  libav %s  %s\n' "$img" $((size / 1000000)) "$user" "$libav" \
        "$([ "$bad" = 0 ] && echo ok || echo FAILED)"
    return "$bad"
}

check_all() {
    local rc=0
    for s in "${SERVICES[@]}"; do check_image "$s" || rc=1; done
    return "$rc"
}

case "${1:-all}" in
    base) base_runtime; base_rust; standins ;;
    compose) base_runtime; standins; compose_standins ;;
    check) check_all ;;
    all)
        base_runtime; base_rust; standins
        for s in "${SERVICES[@]}"; do
            start=$SECONDS; build_service "$s"; log "$s built in $((SECONDS - start)) s"
        done
        check_all ;;
    *) echo "usage: $0 [all|base|compose|check]" >&2; exit 2 ;;
esac
