#!/usr/bin/env bash
# Checks and times the fused (flash) attention in one device call.
#   scripts/gpu_flash.sh DIR OUTDIR
# DIR holds the release binary `vramscope`, the ignored-test binary `cuda-tests` and
# gpu_reference.py. Logs to OUTDIR/log.txt.
set -u
G=$1
O=$2
B=$G/vramscope
export PYTHONUNBUFFERED=1
log() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$O/log.txt"; }
run() { log "$*"; "$@" </dev/null 2>&1 | tee -a "$O/log.txt"; }
L="--model preset:llama-3-8b --fast-weights --device cuda:0 --tokens 8192 --iters 3"

# 1. GPU against the CPU compute mode (tiny: head_dim 32; smollm2: 64; several tiles), for the
#    default kernel and the two variants
run "$G/cuda-tests" --ignored --test-threads 1 fused
run env VRAMSCOPE_FLASH=w4l "$G/cuda-tests" --ignored --test-threads 1 fused
run env VRAMSCOPE_FLASH=w8l "$G/cuda-tests" --ignored --test-threads 1 fused
# 2. llama-3-8b at 8192 tokens: default fused kernel, then the variants against its logits
run "$B" bench $L --quant fp16 --json /tmp/f16.json
run env VRAMSCOPE_FLASH=w4l "$B" bench $L --quant fp16 --compare /tmp/f16.json
run env VRAMSCOPE_FLASH=w8l "$B" bench $L --quant fp16 --compare /tmp/f16.json
run env VRAMSCOPE_FLASH=w4l "$B" bench $L --quant bf16 --json /tmp/bf.json
run env VRAMSCOPE_FLASH=w8l "$B" bench $L --quant bf16 --compare /tmp/bf.json
