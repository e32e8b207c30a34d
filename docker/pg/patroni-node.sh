#!/bin/sh
# Usage: patroni-node     (the image's default command; as the postgres user)
#
# Runs one PostgreSQL node under Patroni with /etc/tiny/patroni.yml. PATRONI_NAME names the
# node (pg1, pg2, pg3): it is also the host name its peers reach it by, unless
# PATRONI_POSTGRESQL_CONNECT_ADDRESS and PATRONI_RESTAPI_CONNECT_ADDRESS say otherwise.
# The password of the superuser, replication and rewind roles is read from PG_PASSWORD_FILE
# (default /run/secrets/pg_password, a compose or Swarm secret): never from the compose file.
set -eu
: "${PATRONI_NAME:?PATRONI_NAME must name this node}"
secret=${PG_PASSWORD_FILE:-/run/secrets/pg_password}
if [ ! -r "$secret" ] || [ ! -s "$secret" ]; then
    echo "patroni-node: the password file $secret is missing, unreadable or empty" >&2
    exit 1
fi
password=$(cat "$secret")
export PATRONI_SUPERUSER_PASSWORD="$password" PATRONI_REPLICATION_PASSWORD="$password" \
    PATRONI_REWIND_PASSWORD="$password"
export PATRONI_POSTGRESQL_CONNECT_ADDRESS="${PATRONI_POSTGRESQL_CONNECT_ADDRESS:-$PATRONI_NAME:5432}"
export PATRONI_RESTAPI_CONNECT_ADDRESS="${PATRONI_RESTAPI_CONNECT_ADDRESS:-$PATRONI_NAME:8008}"
exec patroni /etc/tiny/patroni.yml
