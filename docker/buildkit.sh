# Sourced by docker/build-*.sh: docker_build ARGS... runs `docker build ARGS...` on the engine's
# BuildKit where a CLI can drive it (BuildKit halves build times), else on the legacy builder.
# A docker CLI without buildx (23+) cannot use BuildKit; an older one (Debian's 20.10
# /usr/bin/docker) can: use whichever works.
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
