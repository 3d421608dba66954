#!/usr/bin/env bash
# sabre-pg container entrypoint (docs/docker.md); runs as the non-root user postgres.
#
# First start (empty $PGDATA): initdb with peer authentication on the Unix socket and
# scram-sha-256 everywhere else, the superuser's password from $POSTGRES_PASSWORD or the file
# $POSTGRES_PASSWORD_FILE (required: no password, no server).  Every start: refuse a
# pg_hba.conf that trusts anyone, create database $SABRE_DB if missing and install (or
# upgrade) sabre-pg in it from the wheel, over the socket with the server listening on no
# TCP address; then run the server in the foreground, listening on every address.
# Any other command (e.g. `docker run ... sabre-pg bash`) is run as given.
set -euo pipefail

BIN=/usr/lib/postgresql/15/bin
SOCKET_DIR=/var/run/postgresql
: "${PGDATA:=/var/lib/sabre-pg/data}"
: "${SABRE_DB:=sabre}"

die() {
    echo "sabre-pg-entrypoint: $*" >&2
    exit 1
}

superuser_password() {
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        [ -r "$POSTGRES_PASSWORD_FILE" ] || die "cannot read POSTGRES_PASSWORD_FILE=$POSTGRES_PASSWORD_FILE"
        cat "$POSTGRES_PASSWORD_FILE"
    elif [ -n "${POSTGRES_PASSWORD:-}" ]; then
        printf '%s' "$POSTGRES_PASSWORD"
    else
        die "set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE: the superuser postgres authenticates over TCP with it (scram-sha-256)"
    fi
}

init_cluster() {
    local pwfile
    pwfile=$(mktemp)
    superuser_password >"$pwfile"
    "$BIN/initdb" -D "$PGDATA" --username=postgres --pwfile="$pwfile" --encoding=UTF8 \
        --locale=C.UTF-8 --auth-local=peer --auth-host=scram-sha-256
    rm -f "$pwfile"
    cat >"$PGDATA/pg_hba.conf" <<'HBA'
# sabre-pg container: every connection authenticates (never trust).
# TYPE  DATABASE  USER      ADDRESS     METHOD
local   all       postgres              peer
local   all       all                   scram-sha-256
host    all       all       0.0.0.0/0   scram-sha-256
host    all       all       ::/0        scram-sha-256
HBA
}

refuse_trust() {
    if grep -Ev '^[[:space:]]*(#|$)' "$PGDATA/pg_hba.conf" | grep -Eq '^[[:space:]]*(local|host[a-z]*)[[:space:]].*[[:space:]]trust([[:space:]]|$)'; then
        die "$PGDATA/pg_hba.conf allows trust authentication; replace it with peer or scram-sha-256"
    fi
}

install_sabre() {
    # the setup server listens on a private socket directory only: no client, and not the
    # HEALTHCHECK (`sabre-pg check` on $SOCKET_DIR), reaches it, so the container turns healthy
    # only once the real server below accepts connections
    local setup_socket
    setup_socket=$(mktemp -d)
    "$BIN/pg_ctl" -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=$setup_socket -c jit=off" start
    trap '"$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop; rm -rf '"'$setup_socket'"'' EXIT   # (the path expanded now)
    local dsn="host=$setup_socket user=postgres"
    if [ -z "$("$BIN/psql" "$dsn dbname=postgres" -tAc "SELECT 1 FROM pg_database WHERE datname = '$SABRE_DB'")" ]; then
        "$BIN/createdb" -h "$setup_socket" -U postgres "$SABRE_DB"
    fi
    sabre-pg install --dsn "$dsn dbname=$SABRE_DB"
    "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop
    trap - EXIT
    rm -rf "$setup_socket"
}

if [ "${1:-postgres}" != postgres ]; then
    exec "$@"
fi
[ "$(id -u)" != 0 ] || die "refusing to run the server as root: run the image as its user postgres"
[[ "$SABRE_DB" =~ ^[a-z_][a-z0-9_]*$ ]] || die "SABRE_DB must be a lower-case identifier, got '$SABRE_DB'"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    init_cluster
fi
refuse_trust
install_sabre
# jit=off: the image leaves out the LLVM JIT's files (docker/Dockerfile)
exec "$BIN/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories="$SOCKET_DIR" -c jit=off
