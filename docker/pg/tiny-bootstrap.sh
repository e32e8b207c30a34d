#!/bin/sh
# Usage: tiny-pg-bootstrap CONNSTRING   (Patroni's bootstrap.post_bootstrap, docker/pg/patroni.yml)
#
# Run once, by the node that initialises the cluster, right after initdb (Patroni passes a
# superuser connection string; the standbys copy the result). Creates what Tiny's hosts
# connect to: the database `tiny` and the login role `tiny`, with what the commit log needs
# (tiny.cluster.schema): CREATE on that database (the first host creates the schema `tiny`
# in it) and pg_read_all_stats (followers read the standbys' positions in
# pg_stat_replication). Nothing more: the role is not a superuser and owns nothing else.
#
# The role's password is read from TINY_PG_PASSWORD_FILE (default
# /run/secrets/tiny_pg_password, the secret the Tiny hosts get too): it reaches psql on its
# stdin, never an argument or an environment variable. PostgreSQL hashes it (SCRAM); this
# session neither logs its statements nor, were one to fail, the statement with it.
set -eu
connstring=${1:?tiny-pg-bootstrap: Patroni passes the connection string}
secret=${TINY_PG_PASSWORD_FILE:-/run/secrets/tiny_pg_password}
if [ ! -r "$secret" ] || [ ! -s "$secret" ]; then
    echo "tiny-pg-bootstrap: the password file $secret is missing, unreadable or empty" >&2
    exit 1
fi
if [ "$(grep -c "" "$secret")" != 1 ]; then
    echo "tiny-pg-bootstrap: the password file $secret holds more than one line" >&2
    exit 1
fi
# psql's \set with a backquoted command takes the file's content (its last newline dropped);
# :'password' quotes it as an SQL literal.
psql "$connstring" --no-psqlrc --quiet -v ON_ERROR_STOP=1 <<SQL
SET log_statement = 'none';
SET log_min_error_statement = 'panic';
\\set password \`cat '$secret'\`
CREATE ROLE tiny LOGIN PASSWORD :'password';
\\unset password
CREATE DATABASE tiny;
GRANT CREATE ON DATABASE tiny TO tiny;
GRANT pg_read_all_stats TO tiny;
SQL
echo "tiny-pg-bootstrap: database tiny and role tiny created" >&2
