#!/bin/sh
# Usage: cluster-entrypoint.sh NGINX_ARG...   (supervisord's nginx command, supervisor/supervisord.conf)
#
# Writes var/nginx/listen.conf (nginx's own address, 127.0.0.1:TINY_CLUSTER_PORT) and
# var/nginx/upstreams.conf, which nginx/local.conf includes in `upstream tiny`: two entries
# for each instance supervisord starts, ports TINY_CLUSTER_PORT+1 ..
# TINY_CLUSTER_PORT+TINY_CLUSTER_SIZE (the same variables, so the ports are set in one
# place), then execs nginx with the arguments.
set -eu

: "${TINY_CLUSTER_PORT:?set TINY_CLUSTER_PORT (make cluster sets it)}"
: "${TINY_CLUSTER_SIZE:?set TINY_CLUSTER_SIZE (make cluster sets it)}"
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../var/nginx/upstreams.conf"
mkdir -p "$(dirname "$out")"
echo "listen 127.0.0.1:$TINY_CLUSTER_PORT;" > "$here/../var/nginx/listen.conf"
# passive health, and the same instances again as backups (nginx/local.conf says why)
i=1
: > "$out.tmp"
while [ "$i" -le "$TINY_CLUSTER_SIZE" ]; do
    echo "server 127.0.0.1:$((TINY_CLUSTER_PORT + i)) max_fails=1 fail_timeout=10s;" >> "$out.tmp"
    i=$((i + 1))
done
i=1
while [ "$i" -le "$TINY_CLUSTER_SIZE" ]; do
    echo "server 127.0.0.1:$((TINY_CLUSTER_PORT + i)) backup max_fails=0;" >> "$out.tmp"
    i=$((i + 1))
done
mv "$out.tmp" "$out"
exec nginx "$@"
