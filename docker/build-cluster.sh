#!/usr/bin/env bash
# Usage: docker/build-cluster.sh          (or `make images-cluster`, from the repo root)
#
# Builds tiny-data-server-pg:local (docker/pg: PostgreSQL 15, Patroni, etcd from Debian's
# packages), the image of docker/hosts.yml, on the Debian root docker/build-offline.sh
# imports (tiny-base:bookworm), where Docker cannot pull from a registry: apt reaches the
# Debian mirror from the build. The base is built first when it does not exist.
#
# Environment: BASE_IMAGE (default tiny-base:bookworm), PG_IMAGE (default
# $IMAGE_PREFIX-pg:$IMAGE_TAG, i.e. tiny-data-server-pg:local).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-tiny-base:bookworm}
PG_IMAGE=${PG_IMAGE:-${IMAGE_PREFIX:-tiny-data-server}-pg:${IMAGE_TAG:-local}}
started=$SECONDS

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    # build-offline.sh makes the base first; TARGETS=" " builds no app target (nginx only)
    BASE_IMAGE=$BASE_IMAGE TARGETS=" " docker/build-offline.sh
fi

. docker/buildkit.sh

docker_build --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$PG_IMAGE" docker/pg
printf '\n== %s built in %ds\n' "$PG_IMAGE" $((SECONDS - started))
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' "$PG_IMAGE"
