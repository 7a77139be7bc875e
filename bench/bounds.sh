#!/usr/bin/env bash
# What one hostile request costs (issue: bounded translation, bounded kept
# state): client-chosen type names, a neighbour's wait, kept conversations'
# RSS. BASELINE_BIN=older/tidegate adds that build, same run.
# Usage: bench/bounds.sh   (REPS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tidegate
exec python3 bench/bounds.py "$@"
