#!/usr/bin/env bash
# The waiting-queue scheduler: 10,000 requests from 100 client keys, queued
# then handed out; the weighted fair queue with priorities against the
# round robin it replaced, in the same run. Prints µs per request queued
# and handed out, heap bytes per waiting request, and the ratios.
# Usage: bench/scheduler.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --quiet --example scheduler -- "${1:-7}"
