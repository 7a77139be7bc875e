#!/usr/bin/env bash
# Chaos soak (bench/soak.py): builds the release binary, installs Debian's
# redis-server if missing, then runs MINUTES (default 30) of mixed traffic
# through two replicas sharing Redis while the faults, reloads, Redis
# restarts and a replica restart happen. Loopback only; bounded in time.
# The variant on a Redis Cluster (six redis-servers; the Redis faults kill
# a master, whose replica takes over):
#   bench/soak.sh --replicas 4 --store cluster
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
cargo build --release --quiet
exec python3 bench/soak.py --minutes "${MINUTES:-30}" --workers "${WORKERS:-16}" "$@"
