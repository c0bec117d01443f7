#!/usr/bin/env bash
# Checks and times the fused (flash) attention in one device call.
#   scripts/gpu_flash.sh DIR OUTDIR
# DIR holds the release binary `vramscope`, the ignored-test binary `cuda-tests`
# (`cargo test --release --test cuda --no-run`) and gpu_reference.py. Logs to OUTDIR/log.txt.
# VRAMSCOPE_ATTN=blas selects the cuBLAS attention, VRAMSCOPE_FLASH=w4 the 4-warp kernel.
set -u
G=$1
O=$2
B=$G/vramscope
export PYTHONUNBUFFERED=1
log() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$O/log.txt"; }
run() { log "$*"; "$@" </dev/null 2>&1 | tee -a "$O/log.txt"; }
L="--model preset:llama-3-8b --fast-weights --device cuda:0 --tokens 8192 --iters 3"

# 1. GPU against the CPU compute mode (tiny: head_dim 32; smollm2: 64; several tiles)
run "$G/cuda-tests" --ignored --test-threads 1 logits fused
run env VRAMSCOPE_FLASH=w4 "$G/cuda-tests" --ignored --test-threads 1 fused
# 2. llama-3-8b at 8192 tokens (head_dim 128): cuBLAS attention, then the fused kernels
#    against its logits
for q in fp16 bf16; do
  run env VRAMSCOPE_ATTN=blas "$B" bench $L --quant $q --json "/tmp/blas-$q.json"
  run "$B" bench $L --quant $q --compare "/tmp/blas-$q.json"
  run env VRAMSCOPE_FLASH=w4 "$B" bench $L --quant $q --compare "/tmp/blas-$q.json"
done
# 3. PyTorch + transformers sdpa, same shape
run python3 "$G/gpu_reference.py" bench --preset llama-3-8b --tokens 8192 --dtype fp16 --iters 3
