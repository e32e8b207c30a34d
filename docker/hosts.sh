#!/usr/bin/env bash
# Usage: docker/hosts.sh up|down       (`make hosts`, `make hosts-down`, from the repo root)
#
# up:   the rehearsal of several hosts (docker/hosts.yml), detached. Builds the images that are
#       missing the offline way (docker/build-offline.sh, docker/build-cluster.sh: a Debian root,
#       wheels from the host; `make images-offline` rebuilds them after a change), writes the
#       two password files once (random; build/hosts/, a folder only its owner can enter),
#       starts every service, and returns when nginx answers on 127.0.0.1:TINY_HOSTS_PORT and
#       every service is ready: etcd and each PostgreSQL node healthy, a Patroni leader with a
#       synchronous standby, each Tiny host's own /healthz 200 (it serves its role). Past
#       TINY_HOSTS_TIMEOUT seconds it fails with the state and the logs of what is not ready.
# down: removes every container, network and volume of the project (the day files and the
#       PostgreSQL data with them), then the password files `up` wrote.
#
# Environment:
#   TINY_HOSTS_PROJECT   the compose project (default tiny-hosts)
#   TINY_HOSTS_PORT      nginx's port on 127.0.0.1 (default 8890)
#   TINY_HOSTS_TIMEOUT   seconds `up` waits for readiness (default 240)
#   COMPOSE              the compose command (default: `docker compose` when it works, else
#                        `docker-compose`); both v2 and docker-compose 1.29 run the file
#   TINY_HOSTS_SECRETS   the folder of the password files `up` writes (default build/hosts)
#   TINY_PG_PASSWORD_FILE, TINY_HOSTS_PASSWORD_FILE   password files of your own instead (not
#                        written, not removed); docker/hosts.yml says what each is for
#   TINY_IMAGE, TINY_NGINX_IMAGE, TINY_PG_IMAGE   images of your own (not built here)
set -euo pipefail
cd "$(dirname "$0")/.."

action=${1:-}
project=${TINY_HOSTS_PROJECT:-tiny-hosts}
port=${TINY_HOSTS_PORT:-8890}
timeout=${TINY_HOSTS_TIMEOUT:-240}
file=docker/hosts.yml
secrets_dir=${TINY_HOSTS_SECRETS:-build/hosts}
services=(etcd pg1 pg2 pg3 host1 host2 host3 nginx)
started=$SECONDS

if [ -n "${COMPOSE:-}" ]; then
    read -r -a compose <<< "$COMPOSE"
elif docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
else
    compose=(docker-compose)
fi
run_compose() {
    "${compose[@]}" -p "$project" -f "$file" "$@"
}

say() { printf '== %s (%ds)\n' "$*" $((SECONDS - started)); }

# The project's container of one service (running or not), by compose's labels: v1 and v2
# name containers differently.
container() {
    docker ps -aq --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=$1" | head -n 1
}

build_missing() {
    local app=tiny-data-server-ingest:local nginx=tiny-data-server-nginx:local pg=tiny-data-server-pg:local
    if { [ -z "${TINY_IMAGE:-}" ] && ! docker image inspect "$app" >/dev/null 2>&1; } ||
        { [ -z "${TINY_NGINX_IMAGE:-}" ] && ! docker image inspect "$nginx" >/dev/null 2>&1; }; then
        say "building $app and $nginx (docker/build-offline.sh)"
        TARGETS=ingest docker/build-offline.sh
    fi
    if [ -z "${TINY_PG_IMAGE:-}" ] && ! docker image inspect "$pg" >/dev/null 2>&1; then
        say "building $pg (docker/build-cluster.sh)"
        docker/build-cluster.sh
    fi
}

# The password files: the caller's own ($TINY_PG_PASSWORD_FILE, $TINY_HOSTS_PASSWORD_FILE),
# else FILE in the secrets folder, written once with a random password. Readable by all (each
# container reads its secret as its own user, with no capability that overrides file modes)
# inside a folder only its owner can enter. Exported as absolute paths, which docker/hosts.yml
# mounts as the secrets.
password_files() {
    local variable file
    for variable in TINY_PG_PASSWORD_FILE:pg-password TINY_HOSTS_PASSWORD_FILE:tiny-pg-password; do
        file=${variable#*:}
        variable=${variable%%:*}
        if [ -z "${!variable:-}" ]; then
            mkdir -p "$secrets_dir"
            chmod 0700 "$secrets_dir"
            if [ ! -s "$secrets_dir/$file" ]; then
                (umask 022 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$secrets_dir/$file.new" &&
                    echo >> "$secrets_dir/$file.new")
                mv "$secrets_dir/$file.new" "$secrets_dir/$file"
            fi
            export "$variable=$(realpath "$secrets_dir/$file")"
        elif [ ! -s "${!variable}" ]; then
            echo "error: $variable=${!variable} is missing or empty" >&2
            exit 1
        else
            export "$variable=$(realpath "${!variable}")"
        fi
    done
}

# One line per service that is not ready yet, saying why; nothing when all are.
not_ready() {
    local service id state
    for service in "${services[@]}"; do
        id=$(container "$service")
        if [ -z "$id" ]; then
            echo "$service: no container"
            continue
        fi
        state=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}healthy{{end}}' "$id")
        case "$service:$state" in
            host*:running*)
                case $(host_state "$id") in
                    serves) ;;
                    single)
                        echo "$service: runs without cluster mode (/healthz has no \"cluster\"): its image" \
                            "predates cluster mode; rebuild it (make images-offline TARGETS=ingest)"
                        ;;
                    *) echo "$service: /healthz is not 200 yet" ;;
                esac
                ;;
            *:"running healthy") ;;
            *) echo "$service: $state" ;;
        esac
    done
    primary_and_standby || echo "patroni: no leader with a streaming synchronous standby yet"
    nginx_answers || echo "nginx: no 200 from http://127.0.0.1:$port/healthz yet"
}

# Patroni's view, asked of the first node's REST API that answers, from inside its container
# (no port is published).
primary_and_standby() {
    local node id
    for node in pg1 pg2 pg3; do
        id=$(container "$node")
        [ -n "$id" ] || continue
        if docker exec "$id" python3 -S -c '
import json, sys, urllib.request as u
members = json.load(u.urlopen("http://127.0.0.1:8008/cluster", timeout=2))["members"]
roles = {m["role"] for m in members if m.get("state") in ("running", "streaming")}
sys.exit(0 if {"leader", "sync_standby"} <= roles else 1)' >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

# What a Tiny host's own /healthz says now (Docker's status lags behind by up to 15 checks):
# "serves" (200, in cluster mode), "single" (200 without cluster mode: an image older than
# it), or nothing.
host_state() {
    docker exec "$1" python3 -S -c '
import json, urllib.request as u
answer = json.load(u.urlopen("http://127.0.0.1:8000/healthz", timeout=2))
print("serves" if "cluster" in answer else "single")' 2>/dev/null || true
}

nginx_answers() {
    python3 -S -c '
import sys, urllib.request as u
sys.exit(0 if u.urlopen(sys.argv[1], timeout=3).status == 200 else 1)' "http://127.0.0.1:$port/healthz" >/dev/null 2>&1
}

up() {
    build_missing
    password_files
    say "starting project $project (${compose[*]})"
    TINY_HOSTS_PORT=$port run_compose up -d --no-build
    local waiting
    while true; do
        waiting=$(not_ready)
        if grep -q "without cluster mode" <<< "$waiting"; then
            echo "error: $(grep "without cluster mode" <<< "$waiting")" >&2
            return 1
        fi
        if [ -z "$waiting" ]; then
            say "ready: http://127.0.0.1:$port (ingest: POST /ingest; every host's files: docker/hosts.yml)"
            return 0
        fi
        if [ $((SECONDS - started)) -ge "$timeout" ]; then
            echo "error: not ready after ${timeout}s:" >&2
            echo "$waiting" >&2
            run_compose ps >&2 || true
            for service in $(echo "$waiting" | cut -d: -f1 | sort -u); do
                [ "$service" = patroni ] && service="pg1 pg2 pg3"
                for name in $service; do
                    echo "---- logs of $name" >&2
                    run_compose logs --no-color --tail 60 "$name" >&2 || true
                done
            done
            return 1
        fi
        sleep 2
    done
}

down() {
    # compose reads the whole file, secrets included: name files even when they are gone
    TINY_PG_PASSWORD_FILE=${TINY_PG_PASSWORD_FILE:-/dev/null} TINY_HOSTS_PASSWORD_FILE=${TINY_HOSTS_PASSWORD_FILE:-/dev/null} \
        run_compose down -v --remove-orphans -t 20 || true
    # whatever down left (a container created outside compose's view, a failed removal)
    local label="label=com.docker.compose.project=$project" left
    mapfile -t left < <(docker ps -aq --filter "$label")
    [ ${#left[@]} = 0 ] || docker rm -f -v "${left[@]}" >/dev/null
    mapfile -t left < <(docker volume ls -q --filter "$label")
    [ ${#left[@]} = 0 ] || docker volume rm "${left[@]}" >/dev/null
    mapfile -t left < <(docker network ls -q --filter "$label")
    [ ${#left[@]} = 0 ] || docker network rm "${left[@]}" >/dev/null
    [ -n "${TINY_PG_PASSWORD_FILE:-}" ] || rm -f "$secrets_dir/pg-password"
    [ -n "${TINY_HOSTS_PASSWORD_FILE:-}" ] || rm -f "$secrets_dir/tiny-pg-password"
    say "project $project removed"
}

case "$action" in
    up) up ;;
    down) down ;;
    *)
        echo "usage: $0 up|down" >&2
        exit 2
        ;;
esac
