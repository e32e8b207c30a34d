#!/bin/sh
# Usage: nginx-entrypoint [NGINX_ARG...]   (the nginx image's ENTRYPOINT, see nginx/Dockerfile)
#
# Runs nginx (nginx/compose.conf) and reloads it whenever the addresses of the upstream
# service change: nginx 1.22 looks up `server tiny:8000` only when it loads its config, so
# after `docker compose up --scale tiny=N` it would keep sending requests to replicas that
# are gone and never see new ones. A reload (SIGHUP) starts new workers with the new
# addresses while the old ones finish their requests; keep-alive to the app stays.
#
# Environment:
#   TINY_UPSTREAM_HOST    the service name to watch (default tiny)
#   TINY_WATCH_SECONDS    how often to look it up (default 1; a lookup costs ~1 ms)
#
# Stop signals (QUIT from `docker stop`, TERM, INT) go to nginx; the script exits with
# nginx's exit code.
set -eu

host=${TINY_UPSTREAM_HOST:-tiny}
every=${TINY_WATCH_SECONDS:-1}

addresses() {
    getent ahostsv4 "$host" | awk '{ print $1 }' | sort -u | tr '\n' ' '
}

# nginx refuses to start while `server tiny:8000` resolves to nothing: wait for the first
# replica's address (compose starts both services at once; Swarm schedules tasks in any order).
until [ -n "$(addresses)" ]; do
    [ -n "${waited:-}" ] || echo "nginx-entrypoint: waiting for $host to resolve" >&2
    waited=1
    sleep 0.5
done

# no_new_privs, as the compose file's security_opt asks (Swarm ignores that key): the master
# still switches its workers to www-data, but nothing it execs can gain privileges.
setpriv --no-new-privs nginx "$@" &
nginx_pid=$!
stopping=""
for signal in QUIT TERM INT; do
    # shellcheck disable=SC2064  # expand $signal now
    trap "stopping=1; kill -$signal $nginx_pid 2>/dev/null || true" "$signal"
done

current=$(addresses)
echo "nginx-entrypoint: upstream $host at ${current:-nothing yet}; watching every ${every}s" >&2
while kill -0 "$nginx_pid" 2>/dev/null; do
    sleep "$every" &
    wait $! || true   # returns early on a signal, so the trap runs at once
    [ -z "$stopping" ] || continue
    found=$(addresses)
    if [ -n "$found" ] && [ "$found" != "$current" ]; then
        echo "nginx-entrypoint: upstream $host now at $found(was $current); reloading nginx" >&2
        kill -HUP "$nginx_pid" 2>/dev/null || true
        current=$found
    fi
done
code=0
wait "$nginx_pid" || code=$?
exit "$code"
