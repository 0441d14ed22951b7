#!/bin/bash
# The stand-in postgres image's entrypoint (deploy/local/images/postgres.Containerfile):
# what the official image's docker-entrypoint.sh does for the Compose file.
# First start (empty PGDATA): initdb, the POSTGRES_USER superuser with
# POSTGRES_PASSWORD, the POSTGRES_DB database. Then the server, as postgres.
set -Eeuo pipefail
if [ "${1:0:1}" = - ]; then set -- postgres "$@"; fi
if [ "$1" != postgres ]; then exec "$@"; fi

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "postgres: POSTGRES_PASSWORD is required on the first start" >&2; exit 1; }
    pwfile="$(mktemp)"; printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    # Every address may connect with the password, as in the official image;
    # which addresses the server listens on is its listen_addresses.
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    # Create the database through the local socket only, then stop.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /var/run/postgresql" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres -qc "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "postgres: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec "$@"
