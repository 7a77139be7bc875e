#!/usr/bin/env bash
# Account pools and session affinity: cached share of prompt tokens and
# total time of 20 agent sessions × 10 turns with affinity on and off, and
# a fan-out of 20 over a 3-account pool against its capacity; same run,
# medians.
# Usage: bench/affinity.sh   (REPS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tidegate
exec python3 bench/affinity.py "$@"
