#!/usr/bin/env bash
# Per-core efficiency with tidegate's defaults against nginx at its best
# (1 worker, access_log off), on one pinned core, medians of REPS (3)
# interleaved runs. BASELINE_BIN=older/tidegate adds it as a column.
# Usage: bench/core.sh
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v wrk >/dev/null || need_apt+=(wrk)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
command -v oha >/dev/null || cargo install oha --locked
cargo build --release --quiet --bin tidegate --example upstream --example bare_proxy
exec python3 bench/core.py "$@"
