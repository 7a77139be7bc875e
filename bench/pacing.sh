#!/usr/bin/env bash
# Pacing to advertised limits and slow start, measured: refusals provoked
# by a client over a provider's advertised rpm/tpm and by a burst at a
# pool of accounts of unknown size. BASELINE_BIN=older/tidegate adds the
# build before in the same run; DURATION (180) seconds per advertised case.
# Usage: bench/pacing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tidegate
exec python3 bench/pacing.py "$@"
