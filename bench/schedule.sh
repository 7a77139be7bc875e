#!/usr/bin/env bash
# Capacity scheduled to a provider's limit: 60 requests at once against a
# hard cap of 3 that tidegate learns, 0.5 s each; makespan against the
# ideal and the refusals it took, plain, with a provider that frees slots
# late (slot_release_delay), and over two replicas sharing Redis; medians.
# Usage: bench/schedule.sh   (REPS=3; needs redis-server)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tidegate
exec python3 bench/schedule.py "$@"
