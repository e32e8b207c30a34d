#!/bin/sh
# Usage: entrypoint.sh COMMAND [ARG...]   (the app image's ENTRYPOINT; CMD is tiny-data-server)
#
# Started as a non-root user (the image's default, USER tiny = 10001), it just execs COMMAND.
# Started as root (docker-compose.yml sets `user: root`), it execs COMMAND as the owner of
# the data dir instead, so that a bind-mounted ./data stays writable and owned by the host
# user who owns it, whatever that user's uid is:
#   - data dir owned by a non-root uid: run as that uid and gid;
#   - owned by root and empty (Docker created it for the bind mount): hand it to tiny (10001);
#   - owned by root and not empty: stay root (its files are root's), and say so.
# Whichever way, the app runs with no_new_privs set (setpriv --no-new-privs): no setuid
# program or file capability can give it privileges, also where the orchestrator does not
# apply the compose file's `security_opt: no-new-privileges` (Swarm ignores it).
#
# Cluster mode (docker/hosts.yml): PG_PASSWORD_FILE names a file holding the password of the
# PostgreSQL role in TINY_CLUSTER (a Docker secret: one line). libpq ignores a password file
# that others may read, and a secret is mounted as its source file is (compose: the host's
# file and mode), so this script writes it as a libpq password file, /tmp/tiny-pgpass (the
# container's tmpfs, mode 0600, owned by the user the app runs as), and sets PGPASSFILE: the
# password is in no environment variable and no argument.
set -eu

# PG_PASSWORD_FILE's password as a libpq password file for uid $1, gid $2.
write_pgpass() {
    [ -n "${PG_PASSWORD_FILE:-}" ] || return 0
    if [ ! -r "$PG_PASSWORD_FILE" ] || [ ! -s "$PG_PASSWORD_FILE" ] || [ "$(grep -c "" "$PG_PASSWORD_FILE")" != 1 ]; then
        echo "entrypoint: PG_PASSWORD_FILE=$PG_PASSWORD_FILE is missing, unreadable, empty or more than one line" >&2
        exit 1
    fi
    pgpass=/tmp/tiny-pgpass
    rm -f "$pgpass"
    # any host, port, database and user: the file holds one password; '\' and ':' escaped
    (umask 077 && { printf '*:*:*:*:'; tr -d '\n' < "$PG_PASSWORD_FILE" | sed 's/[\\:]/\\&/g'; echo; } > "$pgpass")
    [ "$(id -u)" != 0 ] || chown "$1:$2" "$pgpass"
    export PGPASSFILE="$pgpass"
}

if [ "$(id -u)" != 0 ]; then
    write_pgpass "$(id -u)" "$(id -g)"
    exec setpriv --no-new-privs -- "$@"
fi
dir=${TINY_DATA_DIR:-/data}
mkdir -p "$dir"
uid=$(stat -c %u "$dir")
gid=$(stat -c %g "$dir")
if [ "$uid" = 0 ]; then
    if [ -z "$(ls -A "$dir")" ]; then
        chown 10001:10001 "$dir"
        uid=10001
        gid=10001
    else
        echo "entrypoint: $dir belongs to root and holds files: running as root" >&2
        write_pgpass 0 0
        exec setpriv --no-new-privs -- "$@"
    fi
fi
write_pgpass "$uid" "$gid"
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs -- "$@"
