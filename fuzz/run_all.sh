#!/bin/sh
# Runs fuzz targets one after another for $SECS seconds each (default 600) under `nice -n 19`,
# each from corpus/<target> (seeded from seeds/<target> and whatever earlier runs found), and
# keeps libFuzzer's output in logs/<target>.log (final stats at the end: executed units,
# exec/s, corpus units added, peak RSS). Usage: fuzz/run_all.sh [target ...]
# The targets are built once first (NO_BUILD=1 runs the binaries already built).
set -u
cd "$(dirname "$0")"
SECS=${SECS:-600}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
TARGETS=${*:-"config index cli_args gguf safetensors torch_snapshot vllm_log vllm_line"}
BIN="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"
if [ "${NO_BUILD:-0}" != 1 ]; then
    RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz build || exit 1
fi
mkdir -p logs corpus
for t in $TARGETS; do
    mkdir -p "corpus/$t" "artifacts/$t"
    if [ -d "seeds/$t" ]; then cp -n "seeds/$t"/* "corpus/$t/" 2>/dev/null; fi
    # The snapshot target starts from the test fixtures (synthetic and recorded by PyTorch).
    if [ "$t" = torch_snapshot ]; then
        cp -n ../tests/fixtures/*.pickle ../tests/fixtures/torch_2_11/*.pickle "corpus/$t/"
    fi
    # The log target starts from the public vLLM logs (V0 and V1).
    if [ "$t" = vllm_log ]; then
        cp -n ../tests/fixtures/vllm-logs/*.log "corpus/$t/"
    fi
    start=$(date -u +%FT%TZ)
    # -malloc_limit_mb: any single allocation over 256 MiB is a crash (an allocation sized by
    # a header field); -timeout: one input taking over 30 s is a crash (a hang).
    nice -n 19 "$BIN/$t" -artifact_prefix="artifacts/$t/" \
        -max_total_time="$SECS" -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=30 \
        -max_len=70000 -print_final_stats=1 "corpus/$t" >"logs/$t.log" 2>&1
    rc=$?
    # One markdown row per run for docs/fuzzing.md: libFuzzer's final stats, the corpus size
    # and the crash/leak/timeout artifacts written.
    stat() { sed -n "s/^stat::$1: *//p" "logs/$t.log" | tail -1; }
    crashes=$(ls "artifacts/$t" 2>/dev/null | wc -l)
    echo "| $t | $start | $(stat number_of_executed_units) | $(stat average_exec_per_sec) | $(ls "corpus/$t" | wc -l) (+$(stat new_units_added)) | $(stat peak_rss_mb) | $crashes | $rc |" >>logs/summary.md
done
