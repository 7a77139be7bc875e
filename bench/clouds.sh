#!/usr/bin/env bash
# Per-event cost of a Bedrock target (event-stream decoding + SSE
# re-emission) over an Anthropic target, same tidegate, same run, medians.
# Usage: bench/clouds.sh   (REPS=5, N=500 streams per alias per rep)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tidegate
exec python3 bench/clouds.py "$@"
