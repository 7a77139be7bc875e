#!/usr/bin/env bash
# Instructions per request under callgrind: nginx at its best, the bare
# hyper proxy and tidegate at its defaults; deterministic where CPU time
# on a shared machine is not. N (2000) requests after WARM (500);
# BASELINE_BIN=older/tidegate adds a column.
# Usage: bench/instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v valgrind >/dev/null || need_apt+=(valgrind)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
command -v oha >/dev/null || cargo install oha --locked
cargo build --release --quiet --bin tidegate --example upstream --example bare_proxy --example streams
exec python3 bench/instructions.py "$@"
