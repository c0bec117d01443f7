#!/usr/bin/env bash
# All GPU checks of the CUDA backend, batched for one device call each.
#   scripts/gpu_check.sh DIR correctness|speed|profile OUTDIR
# DIR holds the release binary `vramscope`, the ignored-test binary `cuda-tests` and
# gpu_reference.py. Everything is logged to OUTDIR/log.txt; JSON reports go beside it.
set -u
G=$1
PHASE=$2
O=$3
B=$G/vramscope
export PYTHONUNBUFFERED=1
log() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$O/log.txt"; }
run() { log "$*"; "$@" 2>&1 | tee -a "$O/log.txt"; }

case $PHASE in
correctness)
  run nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  run "$B" devices
  run "$G/cuda-tests" --ignored --test-threads 1
  for m in tiny smollm2-135m; do
    run "$B" gen-model "$m" "/tmp/$m"
    run "$B" bench --model "/tmp/$m" --device cuda:0 --tokens 100 --iters 1 --json "/tmp/$m.vs.json"
    run python3 "$G/gpu_reference.py" logits --model "/tmp/$m" --tokens 100 --json "/tmp/$m.pt.json"
    run python3 "$G/gpu_reference.py" compare "/tmp/$m.vs.json" "/tmp/$m.pt.json"
  done
  ;;
speed)
  run python3 "$G/gpu_reference.py" bench --preset llama-3-8b --tokens 8192 --dtype fp16 --iters 3 --json "$O/pt-bench.json"
  for q in fp16 int8 nf4; do
    run "$B" bench --model preset:llama-3-8b --fast-weights --quant $q --device cuda:0 --tokens 8192 --iters 3
  done
  ;;
profile)
  for q in int8 fp16; do
    run "$B" profile --model preset:llama-3-8b --quant $q --device cuda:0 --tokens 8192 --json "$O/profile-$q.json"
    run "$B" profile --model preset:llama-3-8b --quant $q --device sim:h200-141gb:dry --tokens 8192 --json "$O/dry-$q.json" -q
  done
  # Out of memory inside a pass: another process holds all but ~3 GiB, the pass wants 4 GiB.
  run nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  FREE=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  HOLD=$(( (FREE - 3072 - 1100) ))MiB
  run "$B" profile --model synthetic:1GiB:4GiB --device cuda:0 --util 0.3 --outside-before "$HOLD" --json "$O/oom.json"
  run nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  ;;
esac
