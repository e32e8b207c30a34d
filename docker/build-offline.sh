#!/usr/bin/env bash
# Usage: docker/build-offline.sh          (or `make images-offline`, from the repo root)
#
# Builds the images docker-compose.yml runs, tiny-data-server-<target>:local and
# tiny-data-server-nginx:local, where Docker cannot pull from a registry (only a Debian mirror,
# PyPI and crates.io are reachable, the last two through a CA only the host's bundle has):
#   1. base: mmdebstrap streams a Debian bookworm minbase root with python3, python3-venv
#      and ca-certificates into `docker import` (skipped when the tag exists already);
#   2. the Dockerfile's target(s) on that base, with the host's CA bundle as build/extra-ca.pem,
#      which the builder stage's pip and cargo trust: it installs Rust from Debian (rustc-web),
#      maturin from PyPI, the crates from crates.io, and builds the package's wheel (tiny + the
#      compiled codec tiny._codec). The host needs neither cargo nor pip for it;
#   3. the nginx image on the same base.
# No root fs or tarball is written to disk (build/ is git-ignored anyway). Then:
#   docker compose up --no-build --scale tiny=4       (TINY_IMAGE_TARGET as for the build)
#
# Environment:
#   TINY_IMAGE_TARGET  the Dockerfile target compose runs: analytics (default) or ingest (the same image)
#   TARGETS       targets to build (default: $TINY_IMAGE_TARGET), e.g. TARGETS="ingest analytics"
#   IMAGE_PREFIX  (default tiny-data-server): target T is tagged $IMAGE_PREFIX-T:$IMAGE_TAG
#   IMAGE_TAG     (default local)              NGINX_IMAGE (default $IMAGE_PREFIX-nginx:$IMAGE_TAG)
#   BASE_IMAGE    base image tag (default tiny-base:bookworm); REBUILD_BASE=1 rebuilds it
#   MIRROR        Debian mirror for the base (default: the host's apt source for bookworm)
#   SECURITY_MIRROR  the same for bookworm-security (default: the host's; "none" leaves it out)
#   CA_BUNDLE     CA file the builder trusts besides the base's (default: the host's
#                 /etc/ssl/certs/ca-certificates.crt; "none": only the base's own CAs)
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-tiny-base:bookworm}
TARGETS=${TARGETS:-${TINY_IMAGE_TARGET:-analytics}}
IMAGE_PREFIX=${IMAGE_PREFIX:-tiny-data-server}
IMAGE_TAG=${IMAGE_TAG:-local}
NGINX_IMAGE=${NGINX_IMAGE:-$IMAGE_PREFIX-nginx:$IMAGE_TAG}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
EXTRA_CA=build/extra-ca.pem
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
started=$SECONDS

step() { printf '\n== %s (%ds)\n' "$*" $((SECONDS - started)); }

# The host's Debian mirror for a suite, from apt's own view of its sources.
apt_source() {
    apt-cache policy 2>/dev/null | awk -v suite="$1/" '$2 ~ /^https?:/ && index($3, suite) == 1 { print $2; exit }'
}

build_base() {
    if ! command -v mmdebstrap >/dev/null; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            mmdebstrap debian-archive-keyring >/dev/null
    fi
    local mirror security sources
    mirror=${MIRROR:-$(apt_source bookworm)}
    if [ -z "$mirror" ]; then
        echo "error: no Debian mirror for bookworm: the host's apt sources name none; set MIRROR=<url>" >&2
        exit 1
    fi
    security=${SECURITY_MIRROR:-$(apt_source bookworm-security)}
    if [ -z "$security" ]; then
        echo "error: no mirror for bookworm-security: the host's apt sources name none; set" \
            "SECURITY_MIRROR=<url>, or SECURITY_MIRROR=none to build the base without security updates" >&2
        exit 1
    fi
    sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main")
    [ "$security" = none ] || sources+=("deb $security bookworm-security main")
    # merged-usr hook: without it the root pulls in usrmerge and perl (+48 MB).
    # path-exclude: no man pages, docs (copyrights stay) or translations, in this root and in
    # whatever later images apt-get installs on it. The stdlib's __pycache__ stays: without
    # it every start of the app would compile the stdlib again.
    # shellcheck disable=SC2016  # $1 is the hook's argument, expanded by mmdebstrap's shell
    $SUDO mmdebstrap --variant=minbase --quiet \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --include=python3,python3-venv,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log; : > "$1"/etc/resolv.conf' \
        bookworm - "${sources[@]}" |
        docker import \
            -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            -c 'ENV LANG=C.UTF-8' \
            -c 'CMD ["/usr/bin/python3"]' \
            -m "Debian bookworm minbase + python3 (docker/build-offline.sh)" \
            - "$BASE_IMAGE"
}

. docker/buildkit.sh

step "base image $BASE_IMAGE"
if [ "${REBUILD_BASE:-0}" != 1 ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "exists; REBUILD_BASE=1 builds it again"
else
    build_base
fi

step "CA for the build: $EXTRA_CA"
mkdir -p build
if [ "$CA_BUNDLE" = none ]; then
    rm -f "$EXTRA_CA"
    echo "none: the builder trusts only the base's CAs"
elif [ -r "$CA_BUNDLE" ]; then
    cmp -s "$CA_BUNDLE" "$EXTRA_CA" 2>/dev/null || cp "$CA_BUNDLE" "$EXTRA_CA"
    echo "$CA_BUNDLE"
else
    echo "error: CA_BUNDLE=$CA_BUNDLE is not readable (CA_BUNDLE=none: only the base's CAs)" >&2
    exit 1
fi

built=()
for target in $TARGETS; do
    step "$target image $IMAGE_PREFIX-$target:$IMAGE_TAG"
    docker_build --build-arg "BASE_IMAGE=$BASE_IMAGE" --target "$target" -t "$IMAGE_PREFIX-$target:$IMAGE_TAG" .
    built+=("$IMAGE_PREFIX-$target:$IMAGE_TAG")
done

step "nginx image $NGINX_IMAGE"
docker_build --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$NGINX_IMAGE" nginx

step "done"
for image in "$BASE_IMAGE" "${built[@]}" "$NGINX_IMAGE"; do
    docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' "$image"
done
