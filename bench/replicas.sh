#!/usr/bin/env bash
# Many replicas on one store (bench/replicas.py): builds the release
# binary, installs Debian's redis-server and redis-tools if missing, then
# runs 4, 8 and 16 `tidegate serve` replicas on one Redis and on a Redis
# Cluster (six nodes), with and without faults, and prints one line per
# case. Loopback only; every case bounded in time (about 30 s each, ~10
# minutes in all). REPLICAS, STORES and FAULTS narrow it (see the script).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
cargo build --release --quiet --bin tidegate
exec python3 bench/replicas.py "$@"
