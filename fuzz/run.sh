#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 30), starting from the
# seeds in fuzz/seeds/ (the working corpus goes to fuzz/corpus/, not kept).
# cargo fuzz needs compiler flags of a nightly toolchain; this machine has
# one stable toolchain, so RUSTC_BOOTSTRAP=1 lets it accept them. A finding
# stops the run with the crashing input under fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O --sanitizer "${SANITIZER:-address}"
for target in request_peek sse_scanner eventstream provider_answer config compressed_answer translation; do
  mkdir -p "fuzz/corpus/$target"
  echo "== fuzz $target for ${secs}s"
  cargo fuzz run -O --sanitizer "${SANITIZER:-address}" "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
    | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|thread .* panicked|Done )" || true
  # libFuzzer exits non-zero on a finding; the pipeline above hides that.
  if [ -n "$(find "fuzz/artifacts/$target" -type f 2>/dev/null | head -1)" ]; then
    echo "fuzz $target: FINDING in fuzz/artifacts/$target" && exit 1
  fi
done
echo "fuzz: every target ran ${secs}s without a finding"
