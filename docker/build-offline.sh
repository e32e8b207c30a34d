#!/usr/bin/env bash
# Usage: docker/build-offline.sh          (or `make images-offline`, from the repo root)
#
# Builds the two images docker-compose.yml runs, tiny-data-server:local and
# tiny-data-server-nginx:local, where Docker cannot pull from a registry (only Debian's
# mirror and PyPI are reachable, and PyPI from the host only):
#   1. base: mmdebstrap streams a Debian bookworm minbase root with python3, python3-venv
#      and ca-certificates into `docker import` (skipped when the tag exists already);
#   2. wheels: the host's pip downloads requirements.txt's pinned wheels into build/wheels
#      (skipped when they are there), and `make codec` builds the compiled codec's wheel
#      there when cargo is installed;
#   3. `docker build` of both images on that base, the app installing from build/wheels only.
# No root fs or tarball is written to disk (build/ is git-ignored anyway). Then:
#   docker compose up --no-build --scale tiny=4
#
# Environment:
#   BASE_IMAGE    base image tag (default tiny-base:bookworm); REBUILD_BASE=1 rebuilds it
#   APP_IMAGE     (default tiny-data-server:local)    NGINX_IMAGE (default tiny-data-server-nginx:local)
#   MIRROR        Debian mirror (default: the host's apt source for bookworm, else deb.debian.org)
#   CODEC=0       leave the compiled codec out (the image then uses the Python codec)
#   PYTHON        python whose pip downloads the wheels (default .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-tiny-base:bookworm}
APP_IMAGE=${APP_IMAGE:-tiny-data-server:local}
NGINX_IMAGE=${NGINX_IMAGE:-tiny-data-server-nginx:local}
WHEELS=build/wheels
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
    local mirror security
    mirror=${MIRROR:-$(apt_source bookworm)}
    mirror=${mirror:-http://deb.debian.org/debian}
    security=$(apt_source bookworm-security)
    security=${security:-http://deb.debian.org/debian-security}
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
        bookworm - \
        "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main" |
        docker import \
            -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            -c 'ENV LANG=C.UTF-8' \
            -c 'CMD ["/usr/bin/python3"]' \
            -m "Debian bookworm minbase + python3 (docker/build-offline.sh)" \
            - "$BASE_IMAGE"
}

# True when build/wheels holds a wheel for every pin of requirements.txt.
have_wheels() {
    local name version
    while IFS='=' read -r name _ version; do
        name=$(echo "$name" | tr 'A-Z-' 'a-z_')
        compgen -G "$WHEELS/${name}-${version}-*.whl" >/dev/null || return 1
    done < <(grep -E '^[A-Za-z0-9_.-]+==' requirements.txt | sed 's/[[:space:]]*#.*//')
}

download_wheels() {
    local python=${PYTHON:-}
    [ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python; } || python=python3
    local arch
    arch=$(uname -m)
    "$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch" --platform "manylinux_2_28_$arch" \
        --python-version 3.11 --implementation cp -d "$WHEELS" -r requirements.txt
}

# The engine's own BuildKit halves build times; a docker CLI without buildx (23+) cannot use
# it, but an older CLI (Debian's 20.10 /usr/bin/docker) can: use whichever works.
docker_build() {
    if docker buildx version >/dev/null 2>&1; then
        docker build "$@"
        return
    fi
    local cli
    for cli in docker /usr/bin/docker; do
        if command -v "$cli" >/dev/null &&
            "$cli" version --format '{{.Client.Version}}' 2>/dev/null | grep -qE '^(18\.09|19\.|20\.|2[12]\.)'; then
            DOCKER_BUILDKIT=1 "$cli" build --progress=plain "$@"
            return
        fi
    done
    DOCKER_BUILDKIT=0 docker build "$@"
}

step "base image $BASE_IMAGE"
if [ "${REBUILD_BASE:-0}" != 1 ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "exists; REBUILD_BASE=1 builds it again"
else
    build_base
fi

step "wheels in $WHEELS"
mkdir -p "$WHEELS"
if have_wheels; then
    echo "every pin of requirements.txt is there"
else
    download_wheels
fi
if [ "${CODEC:-1}" != 0 ] && command -v cargo >/dev/null && make -n codec >/dev/null 2>&1; then
    make codec || echo "warning: make codec failed; the image gets the wheel already in $WHEELS, if any" >&2
fi
ls "$WHEELS"

step "app image $APP_IMAGE"
docker_build --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg OFFLINE=1 -t "$APP_IMAGE" .

step "nginx image $NGINX_IMAGE"
docker_build --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$NGINX_IMAGE" nginx

step "done"
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E "^($BASE_IMAGE|$APP_IMAGE|$NGINX_IMAGE)  " || true
