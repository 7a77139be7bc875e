#!/usr/bin/env bash
# Many concurrent token streams: 1,000 and 5,000 streams of 100 events
# (20,000 events/s either way) through nginx at its best, the bare hyper
# proxy and tidegate at its defaults, on one pinned core; CPU per event,
# time to first event, each event's delay and memory per open stream,
# medians of REPS (3). ONLY=1000|5000 runs one size.
# Usage: bench/streams.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nginx >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo build --release --quiet --bin tidegate --example streams --example bare_proxy
exec python3 bench/streams.py "$@"
