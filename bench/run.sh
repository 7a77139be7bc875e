#!/usr/bin/env bash
# Foundation benchmark: direct vs nginx vs tidegate, same run, same machine.
# Installs what it needs (nginx, wrk from Debian; oha from crates.io),
# builds tidegate in release mode, then runs bench/run.py.
# Usage: bench/run.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v taskset >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
command -v oha >/dev/null || cargo install oha --locked
cargo build --release --quiet --bin tidegate --example shared_latency
exec python3 bench/run.py "$@"
