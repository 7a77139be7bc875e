#!/usr/bin/env bash
# Capacity absorption within a deadline: 30 concurrent requests against
# providers refusing 70% at random, 25 s deadline, default settings; one
# target, then three. Prints share answered, upstream attempts per answer,
# peak upstream rate and what the retry budget allows.
# Usage: bench/capacity.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --quiet --example capacity -- "${1:-3}"
