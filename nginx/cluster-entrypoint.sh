#!/bin/sh
# Usage: cluster-entrypoint.sh NGINX_ARG...   (supervisord's nginx command, supervisor/supervisord.conf)
#
# Writes var/nginx/upstreams.conf, which nginx/local.conf includes in `upstream tiny`: one
# `server 127.0.0.1:PORT max_fails=0;` for each instance supervisord starts, ports
# TINY_CLUSTER_PORT+1 .. TINY_CLUSTER_PORT+TINY_CLUSTER_SIZE (the same variables, so the
# instance ports are set in one place), then execs nginx with the arguments.
set -eu

: "${TINY_CLUSTER_PORT:?set TINY_CLUSTER_PORT (make cluster sets it)}"
: "${TINY_CLUSTER_SIZE:?set TINY_CLUSTER_SIZE (make cluster sets it)}"
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../var/nginx/upstreams.conf"
mkdir -p "$(dirname "$out")"
# max_fails=0: never mark an instance down (nginx/local.conf says why).
i=1
: > "$out.tmp"
while [ "$i" -le "$TINY_CLUSTER_SIZE" ]; do
    echo "server 127.0.0.1:$((TINY_CLUSTER_PORT + i)) max_fails=0;" >> "$out.tmp"
    i=$((i + 1))
done
mv "$out.tmp" "$out"
exec nginx "$@"
