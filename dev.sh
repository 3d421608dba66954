#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine and for CI:
#   ./dev.sh demo [args]   set everything up, then run `sabre-pg demo` (embedded cluster unless a DSN is given)
#   ./dev.sh test [args]   set everything up, then run pytest (default: the whole suite on
#                          $SABRE_TEST_WORKERS pytest-xdist workers, one PostgreSQL cluster each;
#                          default: the CPU count, at most 4; given args run as given, serially)
# Setup: apt packages (PostgreSQL 15 server + PL/Python + pg_cron + numpy and numba (optional,
# the compiled loops of sabre_pg/core/kernels.py) for the backend's python3; iproute2 for `ss`,
# which the Citus tests use to count the coordinator's socket bytes),
# a .venv with `pip install -e '.[test]'` (redone only when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

APT_PACKAGES=(postgresql-15 postgresql-plpython3-15 postgresql-15-cron python3-numpy python3-numba python3-venv iproute2)

usage() {
    echo "usage: ./dev.sh demo [sabre-pg demo args] | ./dev.sh test [pytest args]" >&2
    exit 2
}

ensure_apt() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "dev.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
        sudo=(sudo)
    fi
    echo "dev.sh: installing ${missing[*]}" >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

ensure_venv() {
    if [ ! -x .venv/bin/python ]; then
        echo "dev.sh: creating .venv" >&2
        python3 -m venv .venv
    fi
    local stamp=.venv/.sabre-pg-stamp want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        echo "dev.sh: pip install -e '.[test]'" >&2
        .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
        .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
        echo "$want" >"$stamp"
    fi
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
    demo)
        ensure_apt
        ensure_venv
        exec .venv/bin/sabre-pg demo "$@"
        ;;
    test)
        ensure_apt
        ensure_venv
        if [ $# -eq 0 ]; then
            workers=${SABRE_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
            ((workers <= 4)) || workers=4
            # loadscope: a module's tests run on one worker, in order, sharing its module fixtures;
            # tests/conftest.py orders the modules (the podman image build first, so it overlaps)
            set -- -q tests
            ((workers < 2)) || set -- -n "$workers" --dist loadscope --no-loadscope-reorder "$@"
        fi
        exec .venv/bin/python -m pytest "$@"
        ;;
    *) usage ;;
esac
