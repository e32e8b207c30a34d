#!/bin/sh
# Usage: nginx-entrypoint [NGINX_ARG...]   (the nginx image's ENTRYPOINT, see nginx/Dockerfile)
#
# Runs nginx and reloads it whenever the addresses of the app change: nginx 1.22 looks up an
# upstream's names only when it loads its config, so it would keep sending requests to
# replicas or hosts that are gone and never see new ones. A reload (SIGHUP) starts new
# workers with the new addresses while the old ones finish their requests; keep-alive to the
# app stays. Two ways, by the environment:
#
# - docker-compose.yml (nginx/compose.conf, `server tiny:8000`): TINY_UPSTREAM_HOST names the
#   service to watch (default tiny); nginx starts once it resolves and reloads on a change.
# - docker/hosts.yml (nginx/hosts.conf): TINY_INGEST_HOSTS and TINY_READ_HOSTS name the ingest
#   hosts and the hosts for reads only (space-separated); this script writes the servers of
#   nginx/hosts.conf's two upstreams from their addresses into /run/tiny-upstreams/ (ingest.conf:
#   the ingest hosts; read.conf: every host, the read hosts at twice the weight; each address
#   twice, as nginx/compose.conf lists `tiny`) and rewrites them, with a reload, when the
#   addresses change. A name that does not resolve (its host is down) is left out; an upstream
#   with no address gets one entry marked down, so nginx answers 502 until a host is back.
#
# Environment:
#   TINY_UPSTREAM_HOST    the service name to watch without TINY_INGEST_HOSTS (default tiny)
#   TINY_INGEST_HOSTS, TINY_READ_HOSTS   hosts mode (above)
#   TINY_UPSTREAM_PORT    the app's port in hosts mode (default 8000)
#   TINY_WATCH_SECONDS    how often to look them up (default 1; a lookup costs ~1 ms)
#
# Stop signals (QUIT from `docker stop`, TERM, INT) go to nginx; the script exits with
# nginx's exit code.
set -eu

host=${TINY_UPSTREAM_HOST:-tiny}
ingest=${TINY_INGEST_HOSTS:-}
reads=${TINY_READ_HOSTS:-}
port=${TINY_UPSTREAM_PORT:-8000}
every=${TINY_WATCH_SECONDS:-1}
upstreams=/run/tiny-upstreams

addresses() {
    getent ahostsv4 "$1" | awk '{ print $1 }' | sort -u | tr '\n' ' '
}

# One upstream's servers, from "WEIGHT NAME..." groups: each address with passive health, then
# each again as a backup that is never written off; a line marked down when there is none.
servers() {
    found=""
    for group in "$@"; do
        weight=${group%% *}
        for name in ${group#* }; do
            for address in $(addresses "$name"); do
                found="$found $address:$port/$weight"
            done
        done
    done
    if [ -z "$found" ]; then
        echo "server 127.0.0.1:$port down;  # no host resolves"
        return
    fi
    for entry in $found; do
        echo "server ${entry%/*} weight=${entry#*/} max_fails=1 fail_timeout=10s;"
    done
    for entry in $found; do
        echo "server ${entry%/*} weight=${entry#*/} backup max_fails=0;"
    done
}

# Hosts mode: write both files (each by rename: nginx never reads half of one); say whether
# they changed.
write_upstreams() {
    mkdir -p "$upstreams"
    servers "1 $ingest" > "$upstreams/ingest.conf.new"
    servers "1 $ingest" "2 $reads" > "$upstreams/read.conf.new"
    changed=1
    if cmp -s "$upstreams/ingest.conf.new" "$upstreams/ingest.conf" 2>/dev/null &&
        cmp -s "$upstreams/read.conf.new" "$upstreams/read.conf" 2>/dev/null; then
        changed=""
    fi
    mv "$upstreams/ingest.conf.new" "$upstreams/ingest.conf"
    mv "$upstreams/read.conf.new" "$upstreams/read.conf"
    [ -n "$changed" ]
}

# The addresses in read.conf, for the log.
summary() {
    awk '!/backup/ { print $2, $3 }' "$upstreams/read.conf" | tr '\n' ' '
}

if [ -n "$ingest" ]; then
    write_upstreams || true
    echo "nginx-entrypoint: ingest hosts $ingest, read hosts ${reads:-none} at $(summary); watching every ${every}s" >&2
else
    # nginx refuses to start while `server tiny:8000` resolves to nothing: wait for the first
    # replica's address (compose starts both services at once; Swarm schedules tasks in any order).
    until [ -n "$(addresses "$host")" ]; do
        [ -n "${waited:-}" ] || echo "nginx-entrypoint: waiting for $host to resolve" >&2
        waited=1
        sleep 0.5
    done
fi

# no_new_privs, as the compose file's security_opt asks (Swarm ignores that key): the master
# still switches its workers to www-data, but nothing it execs can gain privileges.
setpriv --no-new-privs nginx "$@" &
nginx_pid=$!
stopping=""
for signal in QUIT TERM INT; do
    # shellcheck disable=SC2064  # expand $signal now
    trap "stopping=1; kill -$signal $nginx_pid 2>/dev/null || true" "$signal"
done

if [ -z "$ingest" ]; then
    current=$(addresses "$host")
    echo "nginx-entrypoint: upstream $host at ${current:-nothing yet}; watching every ${every}s" >&2
fi
while kill -0 "$nginx_pid" 2>/dev/null; do
    sleep "$every" &
    wait $! || true   # returns early on a signal, so the trap runs at once
    [ -z "$stopping" ] || continue
    if [ -n "$ingest" ]; then
        if write_upstreams; then
            echo "nginx-entrypoint: hosts now at $(summary); reloading nginx" >&2
            kill -HUP "$nginx_pid" 2>/dev/null || true
        fi
        continue
    fi
    found=$(addresses "$host")
    if [ -n "$found" ] && [ "$found" != "$current" ]; then
        echo "nginx-entrypoint: upstream $host now at $found(was $current); reloading nginx" >&2
        kill -HUP "$nginx_pid" 2>/dev/null || true
        current=$found
    fi
done
code=0
wait "$nginx_pid" || code=$?
exit "$code"
