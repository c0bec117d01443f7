#!/usr/bin/env bash
# All GPU checks of the CUDA backend, batched for one device call each.
#   scripts/gpu_check.sh DIR correctness|speed|profile|speed-ab|breakdown|attn|ncu|smoke OUTDIR
# DIR holds the release binary `vramscope`, the ignored-test binary `cuda-tests` and
# gpu_reference.py. Everything is logged to OUTDIR/log.txt; JSON reports go beside it.
set -u
G=$1
PHASE=$2
O=$3
B=$G/vramscope
export PYTHONUNBUFFERED=1
log() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$O/log.txt"; }
run() { log "$*"; "$@" </dev/null 2>&1 | tee -a "$O/log.txt"; }

# A compact summary of a profile report (the full JSON with its NVML samples can be large).
summ() { python3 - "$1" <<'PY' | tee -a "$O/log.txt"
import json, sys
r = json.load(open(sys.argv[1]))
c = r["checkpoints"]
out = dict(file=sys.argv[1].split("/")[-1], device=r["device"]["spec"], weights=r["weights_bytes"],
           peak=c["t2"]["allocated_peak"], t1=c["t1"], t3=c["t3"], truth=r["truth"]["non_kv_bytes"],
           tokens=r["settings"]["tokens"], seqs=r["settings"]["seqs"],
           sampled=r.get("sampled_tokens"),
           formulas={f["id"]: dict(non_kv=f["non_kv_bytes"], err=f["error_bytes"], kv=f["kv_bytes"],
                                    verify=(f["verify"] or {}).get("message")) for f in r["formulas"]},
           truth_verify=(r["truth"]["verify"] or {}).get("message"),
           peak_owner=[(e["tensor"], e["category"]) for e in r["events"]
                       if e["kind"] == "alloc" and e["pass"] == 1 and e["allocated"] == c["t2"]["allocated_peak"]][:1])
print(json.dumps(out))
PY
}

# Per-rank summary of a tensor-parallel report: weights, framework peak, reserved, truth, the
# new formula's error against the truth, NCCL's entries, and the engine's budget.
summtp() { python3 - "$1" <<'PY' | tee -a "$O/log.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print("file", sys.argv[1].split("/")[-1], "tp", r.get("tp"), "binding rank", r.get("rank"))
for k in r.get("ranks") or [r]:
    c = k["checkpoints"]
    f = {x["id"]: x for x in k["formulas"]}
    truth = k["truth"]["non_kv_bytes"]
    nccl = [(e["tensor"], e["bytes"]) for e in k["events"] if e["kind"] == "outside-alloc"]
    print(json.dumps(dict(rank=k.get("rank"), device=k["device"]["spec"], weights=k["weights_bytes"],
        peak=c["t2"]["allocated_peak"], reserved_t3=c["t3"]["reserved"], reserved_peak=c["t2"]["reserved_peak"],
        truth=truth, pr9516_non_kv=f["pr9516"]["non_kv_bytes"], pr9516_err=f["pr9516"]["error_bytes"],
        pr9516_err_pct=round(100 * f["pr9516"]["error_bytes"] / truth, 3),
        pr9352_err=f["pr9352"]["error_bytes"], outside=nccl,
        passes=[(p["index"], p["end_us"] - p["start_us"]) for p in k["passes"]],
        verify={i: (x["verify"] or {}).get("message", "")[:70] for i, x in f.items()})))
for e in r.get("engine", []):
    print("engine", e["key"], e["kv_blocks"], "binding rank", e["binding_rank"], e["rank_blocks"])
PY
}

case $PHASE in
tp70)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  run "$B" profile --model preset:llama-3-70b --quant fp16 --device cuda:0 --tp 2 --json /tmp/f70.json --png "$O/f70tp2.png" --csv /tmp/f70.csv
  summtp /tmp/f70.json
  run "$B" profile --model preset:llama-3-70b --quant fp16 --device sim:h200-141gb:dry --tp 2 -q --json /tmp/f70dry.json
  summtp /tmp/f70dry.json
  gzip -c /tmp/f70.json > "$O/f70tp2.json.gz"
  gzip -c /tmp/f70.summary.csv > "$O/f70tp2.summary.csv.gz"
  ;;
tp2)
  # The GPU tests after the CUDA backend was split into files, and NCCL's memory measured
  # across each communicator's first collective.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  mkdir -p /work/main/target/release && ln -sf "$PWD/$B" /work/main/target/release/vramscope
  run "$G/cuda-tests" --ignored --test-threads 1
  run "$G/cuda-opt-tests" --ignored --test-threads 1
  for q in fp16 int8; do
    run "$B" profile --model preset:llama-3-8b --quant $q --device cuda:0 --tp 2 -q --json /tmp/tp2-$q.json --png "$O/tp2-$q.png"
    summtp /tmp/tp2-$q.json
    gzip -c /tmp/tp2-$q.json > "$O/tp2-$q.json.gz"
  done
  run "$B" profile --model preset:llama-3-8b --quant fp16 --device cuda:0 -q --json /tmp/tp1-fp16.json
  summtp /tmp/tp1-fp16.json
  ;;
tp)
  # Issue 11 on two GPUs: NCCL between ranks, per-rank memory against the dry run, logits of
  # --tp 2 against --tp 1, pass time at 8192 tokens, the all-reduce share of it.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  run nvidia-smi topo -m
  run "$B" profile --model preset:llama-3-8b --quant int8 --device cuda:0 --tp 2 -q --json /tmp/i8tp2.json
  summtp /tmp/i8tp2.json
  run "$B" profile --model preset:llama-3-8b --quant int8 --device sim:h200-141gb:dry --tp 2 -q --json /tmp/i8tp2dry.json
  summtp /tmp/i8tp2dry.json
  gzip -c /tmp/i8tp2.json > "$O/i8tp2.json.gz"
  run "$B" bench --model preset:llama-3-8b --quant fp16 --device cuda:0 --tokens 1024 --seqs 4 --iters 1 --json /tmp/l1.json
  run "$B" bench --model preset:llama-3-8b --quant fp16 --device cuda:0 --tokens 1024 --seqs 4 --iters 1 --tp 2 --compare /tmp/l1.json
  run "$B" bench --model preset:llama-3-8b --quant fp16 --device cuda:0 --tokens 8192 --seqs 1 --iters 5 --fast-weights --op-times
  run "$B" bench --model preset:llama-3-8b --quant fp16 --device cuda:0 --tokens 8192 --seqs 1 --iters 5 --fast-weights --op-times --tp 2
  run "$B" profile --model preset:llama-3-70b --quant fp16 --device cuda:0 --tp 2 -q --json /tmp/f70tp2.json
  summtp /tmp/f70tp2.json
  run "$B" profile --model preset:llama-3-70b --quant fp16 --device sim:h200-141gb:dry --tp 2 -q --json /tmp/f70tp2dry.json
  summtp /tmp/f70tp2dry.json
  gzip -c /tmp/f70tp2.json > "$O/f70tp2.json.gz"
  ;;
replay)
  # The allocator's top-down address model against PyTorch's allocator: dry traces replayed
  # (placement and reserved bytes), GPU against dry for fp16 and int8, the GPU tests.
  run "$G/cuda-tests" --ignored --test-threads 1
  for q in fp16 int8; do
    run "$B" profile --model preset:llama-3-8b --quant $q --device sim:h200-141gb:dry -q --json "/tmp/dry-$q.json" --torch-snapshot "/tmp/dry-$q.pickle"
    summ "/tmp/dry-$q.json"
    run python3 "$G/replay_allocator.py" "/tmp/dry-$q.pickle" --json "$O/replay-$q.json"
    run "$B" profile --model preset:llama-3-8b --quant $q --device cuda:0 -q --json "/tmp/gpu-$q.json"
    summ "/tmp/gpu-$q.json"
  done
  ;;
fused)
  # vLLM's fused Llama layers on the H200: the GPU tests, dry against GPU byte for byte for
  # fp16 and int8 at vLLM's defaults (one pass, and three), PyTorch's own caching allocator
  # replaying vramscope's trace event by event, and the pass time against the last runs.
  run "$B" devices
  run "$G/cuda-tests" --ignored --test-threads 1
  run "$G/cuda-opt-tests" --ignored --test-threads 1
  for q in fp16 int8; do
    run "$B" profile --model preset:llama-3-8b --quant $q --device sim:h200-141gb:dry -q --json "/tmp/dry-$q.json" --torch-snapshot "/tmp/dry-$q.pickle"
    summ "/tmp/dry-$q.json"
    run "$B" profile --model preset:llama-3-8b --quant $q --device cuda:0 --json "/tmp/gpu-$q.json"
    summ "/tmp/gpu-$q.json"
    run python3 "$G/replay_allocator.py" "/tmp/dry-$q.pickle" --json "$O/replay-$q.json"
  done
  run "$B" profile --model preset:llama-3-8b --quant fp16 --device sim:h200-141gb:dry --passes 3 --no-verify -q --json /tmp/dry-fp16-3.json --torch-snapshot /tmp/dry-fp16-3.pickle
  summ /tmp/dry-fp16-3.json
  run "$B" profile --model preset:llama-3-8b --quant fp16 --device cuda:0 --passes 3 --no-verify --json /tmp/gpu-fp16-3.json
  summ /tmp/gpu-fp16-3.json
  run python3 "$G/replay_allocator.py" /tmp/dry-fp16-3.pickle --json "$O/replay-fp16-3.json"
  run "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 3
  ;;
final)
  # After the merges: the GPU tests (CUDA backend, OPT and bitsandbytes 4-bit, the app on a real
  # GPU), the bf16 sampler against PyTorch, OPT on the GPU against the dry run, and a vramscope
  # trace opened by PyTorch's own memory viewer. $G holds the binaries: vramscope, cuda-tests,
  # cuda-opt-tests, gui-tests.
  run "$G/cuda-tests" --ignored --test-threads 1
  run "$G/cuda-opt-tests" --ignored --test-threads 1
  run "$B" bench --model preset:llama-3-8b --fast-weights --quant bf16 --device cuda:0 --tokens 8192 --iters 1 --sampler-dump /tmp/sd-bf16
  run python3 "$G/sampler_reference.py" /tmp/sd-bf16
  for d in sim:h200-141gb:dry cuda:0; do
    run "$B" profile --model preset:opt-125m --quant fp16 --device $d -q --json "/tmp/opt-${d%%:*}.json"
    summ "/tmp/opt-${d%%:*}.json"
  done
  run "$B" profile --model preset:llama-3-8b --quant int8 --device cuda:0 -q --no-verify --torch-snapshot /tmp/l8.pickle
  run "$B" profile --model preset:tiny --device cuda:0 --tokens 64 --max-model-len 64 --max-num-seqs 64 -q --torch-snapshot /tmp/tiny.pickle
  for f in tiny l8; do
    run python3 -m torch.cuda._memory_viz trace_plot /tmp/$f.pickle -o "/tmp/$f.trace.html"
    run python3 -m torch.cuda._memory_viz segment_plot /tmp/$f.pickle -o "/tmp/$f.segments.html"
    run python3 "$G/check_torch_snapshot.py" /tmp/$f.pickle
    run "$B" report /tmp/$f.pickle
    run ls -la /tmp/$f.pickle /tmp/$f.trace.html /tmp/$f.segments.html
  done
  cp /tmp/tiny.trace.html "$O/" 2>/dev/null
  run "$G/gui-tests" --ignored --nocapture app_on_a_real_gpu
  ;;
vllm)
  # Issue 10 on the H200: the sampler against PyTorch, vLLM's defaults on the GPU against the
  # dry run, and verify's "over budget" against a real OOM.
  run "$B" devices
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  for q in fp16 bf16; do
    run "$B" bench --model preset:llama-3-8b --fast-weights --quant $q --device cuda:0 --tokens 8192 --iters 1 --sampler-dump "/tmp/sd-$q"
    run python3 "$G/sampler_reference.py" "/tmp/sd-$q"
  done
  for q in fp16 int8; do
    run "$B" profile --model preset:llama-3-8b --quant $q --device sim:h200-141gb:dry -q --json "/tmp/dry-$q.json"
    summ "/tmp/dry-$q.json"
    run "$B" profile --model preset:llama-3-8b --quant $q --device cuda:0 --json "/tmp/gpu-$q.json"
    summ "/tmp/gpu-$q.json"
  done
  run "$B" profile --model preset:llama-3-8b --quant fp16 --device cuda:0 --outside-before 16GiB --json /tmp/gpu-crowded.json
  summ /tmp/gpu-crowded.json
  ;;
house)
  # Issue 28: the GPU tests after the layers moved, then issue 21 on the H200: a release's
  # profile on the GPU against the dry run, the true maximum with NVML, and an fp8 KV cache.
  run nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  # The test binaries start the CLI from the path they were built with.
  mkdir -p /work/target-rel/release && ln -sf "$PWD/$B" /work/target-rel/release/vramscope
  run "$G/cuda-tests" --ignored --test-threads 1
  run "$G/cuda-opt-tests" --ignored --test-threads 1
  if "$B" profile --help | grep -q -- --true-max; then
    for d in cuda:0 sim:h200:dry; do
      run "$B" profile --model preset:llama-3-8b --quant int8 --device $d --vllm 0.6.4 --true-max --json "/tmp/tm-${d%%:*}.json"
      summ "/tmp/tm-${d%%:*}.json"
    done
    run "$B" profile --model preset:llama-3-8b --quant fp16 --device cuda:0 --kv-cache-dtype fp8 --json /tmp/fp8.json
    summ /tmp/fp8.json
    python3 - /tmp/fp8.json <<'PY' | tee -a "$O/log.txt"
import json, sys
r = json.load(open(sys.argv[1]))
kv = [e for e in r["events"] if e["kind"] == "alloc" and e["category"] in ("kv_cache", "kv-cache", "KvCache")]
print("fp8 KV tensors:", len(kv), "first", kv[0]["tensor"] if kv else None, kv[0].get("bytes") if kv else None,
      "block bytes", r["kv_geometry"]["block_size"], r["kv_geometry"]["dtype_bytes"])
PY
  fi
  ;;
correctness)
  run nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  run "$B" devices
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  # GPU against the CPU compute mode, same seeded weights
  while read -r m q t s thr; do
    run "$B" bench --model "$m" --quant "$q" --device sim:h100-80gb --tokens "$t" --seqs "$s" --iters 0 --int8-threshold "$thr" --json /tmp/cpu.json
    run "$B" bench --model "$m" --quant "$q" --device cuda:0 --tokens "$t" --seqs "$s" --iters 1 --int8-threshold "$thr" --compare /tmp/cpu.json
  done <<LIST
preset:tiny fp16 100 3 0
preset:smollm2-135m fp16 96 2 0
preset:tiny bf16 100 3 0
preset:tiny int8 100 3 1.0
preset:tiny int8 100 3 0
preset:tiny nf4 100 3 0
LIST
  for m in tiny smollm2-135m; do
    run "$B" gen-model "$m" "/tmp/$m"
    run "$B" bench --model "/tmp/$m" --device cuda:0 --tokens 100 --iters 1 --json "/tmp/$m.vs.json"
    run python3 "$G/gpu_reference.py" logits --model "/tmp/$m" --tokens 100 --json "/tmp/$m.pt.json"
    run python3 "$G/gpu_reference.py" compare "/tmp/$m.vs.json" "/tmp/$m.pt.json"
  done
  ;;
speed)
  # Issue 4's speed check in one call, after the GPU tests: PyTorch + transformers (sdpa), then
  # vramscope's fp16 (with its per-op GPU times), int8 and nf4 passes of the llama-3-8b shape at
  # 8192 tokens.
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  run python3 "$G/gpu_reference.py" bench --preset llama-3-8b --tokens 8192 --dtype fp16 --iters 3 --json "$O/pt-bench.json"
  L="--model preset:llama-3-8b --fast-weights --device cuda:0 --tokens 8192 --iters 3"
  run "$B" bench $L --quant fp16 --op-times --json "$O/vs-fp16.json"
  for q in int8 nf4; do
    run "$B" bench $L --quant $q --json "$O/vs-$q.json"
  done
  ;;
profile)
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  run "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 3
  for d in cuda:0 sim:h200-141gb:dry; do
    run "$B" profile --model preset:smollm2-135m --quant fp16 --device $d --tokens 8192 --json "$O/smol-fp16-${d%%:*}.json"
  done
  # Out of memory inside a pass: another process holds all but ~3 GiB, the pass wants 4 GiB.
  run nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  FREE=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  HOLD=$(( FREE - 3072 - 1100 ))MiB
  run "$B" profile --model synthetic:1GiB:4GiB --device cuda:0 --util 0.3 --outside-before "$HOLD"
  run nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  run "$B" profile --model preset:llama-3-8b --quant int8 --device sim:h200-141gb:dry --tokens 8192 --json "$O/dry-int8.json"
  run "$B" profile --model preset:llama-3-8b --quant int8 --device cuda:0 --tokens 8192 --json "$O/profile-int8.json"
  for q in fp16 nf4; do
    run "$B" profile --model preset:llama-3-8b --quant $q --device cuda:0 --tokens 8192 --json "$O/profile-$q.json"
  done
  ;;
speed-ab)
  # What the fp16 pass time depends on: the attention buffer bound and the NVML sampler.
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  run "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 3
  run env VRAMSCOPE_NVML_INTERVAL_US=200000 "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 3
  run env VRAMSCOPE_ATTN_SCRATCH_MIB=1024 "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 3
  run "$B" bench --model preset:llama-3-8b --fast-weights --quant bf16 --device cuda:0 --tokens 8192 --iters 3
  ;;
breakdown)
  # Where the fp16 8192-token pass spends its GPU time, vramscope against PyTorch.
  run bash -c 'ls /usr/local/cuda/bin; command -v nsys ncu || true'
  run python3 "$G/gpu_reference.py" bench --preset llama-3-8b --tokens 8192 --dtype fp16 --iters 2 --kernels
  run "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 2 --op-times
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$NSYS" ]; then
    run "$NSYS" profile -o /tmp/vs --force-overwrite true "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 1
    run "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$O/vs" /tmp/vs.nsys-rep
  fi
  ;;
attn)
  # The fused attention variants (VRAMSCOPE_FLASH) against the cuBLAS path and each other,
  # after the GPU tests; then where the default's pass time goes, and PyTorch beside it.
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  L="--model preset:llama-3-8b --fast-weights --device cuda:0 --tokens 8192 --iters 3"
  run env VRAMSCOPE_ATTN=blas "$B" bench $L --quant fp16 --json /tmp/blas-fp16.json
  for v in ${FLASH_VARIANTS:-wg w8l w4}; do
    run env VRAMSCOPE_FLASH=$v "$B" bench $L --quant fp16 --compare /tmp/blas-fp16.json
  done
  run "$B" bench $L --quant fp16 --compare /tmp/blas-fp16.json --op-times
  run "$B" bench $L --quant bf16
  run python3 "$G/gpu_reference.py" bench --preset llama-3-8b --tokens 8192 --dtype fp16 --iters 3
  ;;
ncu)
  # Nsight Compute on one launch of each fused attention variant named in FLASH_VARIANTS.
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for v in ${FLASH_VARIANTS:-w8l}; do
    run env VRAMSCOPE_FLASH=$v "$NCU" --kernel-name regex:flash_attn --launch-skip 8 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section LaunchStats \
      "$B" bench --model preset:llama-3-8b --fast-weights --quant fp16 --device cuda:0 --tokens 8192 --iters 0
  done
  ;;
smoke)
  # The merged build end to end: GPU tests, the new model-file loaders on the GPU (two bf16
  # shards, a bitsandbytes int8 checkpoint loaded without re-quantizing), nf4, and the same
  # checkpoint dry for comparison.
  run "$B" devices
  if [ -x "$G/cuda-tests" ]; then run "$G/cuda-tests" --ignored --test-threads 1; fi
  run "$B" gen-model smollm2-135m /tmp/shards --dtype bf16 --shards 2
  run "$B" profile --model /tmp/shards --quant bf16 --device cuda:0 --tokens 4096 --seqs 4 --json "$O/shards-bf16.json"
  run "$B" gen-model smollm2-135m /tmp/bnb --bnb-int8
  run "$B" profile --model /tmp/bnb --quant int8 --device cuda:0 --tokens 4096 --json "$O/bnb-int8-cuda.json"
  run "$B" profile --model /tmp/bnb --quant int8 --device sim:h200-141gb:dry --tokens 4096 --json "$O/bnb-int8-dry.json"
  run "$B" profile --model preset:smollm2-135m --quant nf4 --device cuda:0 --tokens 4096 --png "$O/nf4-cuda.png"
  ;;
esac
