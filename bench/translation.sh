#!/usr/bin/env bash
# Translation's cost over pass-through: CPU per streamed event and per
# 10 KB request, same tidegate, same run, medians.
# Usage: bench/translation.sh   (REPS=9, N=600 streams, M=6000 requests per load per rep)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tidegate
exec python3 bench/translation.py "$@"
