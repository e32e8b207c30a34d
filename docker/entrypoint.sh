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
set -eu

if [ "$(id -u)" != 0 ]; then
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
        exec setpriv --no-new-privs -- "$@"
    fi
fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs -- "$@"
