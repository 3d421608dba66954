#!/usr/bin/env bash
# Start the embedded cluster (initdb + install sabre on first run), then stay in the
# foreground following the server log; stop the server cleanly on SIGTERM/SIGINT.
set -euo pipefail
sabre-pg server start
trap 'sabre-pg server stop; exit 0' TERM INT
tail -n +1 -F /var/lib/sabre-pg/cluster/server.log &
wait $!
