"""Device memory outside PyTorch's allocator that a V1 start adds, step by step (issue 46).

vLLM 0.19 measures "non-torch forward increase" when its `memory_profiling` context exits,
and that context holds both the profile run and `profile_cudagraph_memory` (0.19.0
v1/worker/gpu_worker.py L366-381): the estimate's warm-ups and captures at the two largest
capture sizes (512 and 504 tokens) run GEMMs of shapes the 8192-token profile pass never ran,
and the CUDA driver loads their kernels' modules on first use (lazy loading). This script
replays that order with PyTorch at Llama-3-8B's shapes (bf16, seeded weights, transformers'
LlamaForCausalLM with sdpa) and prints, after each step, the process's device memory outside
the caching allocator: cudaMemGetInfo's used memory less `memory_reserved`.

Usage: python3 scripts/nontorch_estimate_probe.py [OUT.json]
"""
import gc
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

MIB = 1 << 20


def outside():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) - torch.cuda.memory_reserved()


def recorder():
    """`(steps, mark)`: `mark(name)` prints and keeps the memory outside the allocator now."""
    steps = []

    def mark(name):
        o = outside()
        steps.append({"step": name, "outside_bytes": o})
        print(f"{name:<58} outside the allocator {o / MIB:9.1f} MiB", flush=True)

    return steps, mark


def save(path, steps):
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                   "steps": steps}, f, indent=1)


def main():
    steps, mark = recorder()

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    mark("context")
    cfg = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model.eval()
    mark("weights made")
    with torch.inference_mode():
        ids = torch.randint(0, cfg.vocab_size, (1, 8192), device="cuda")
        model.model(ids, use_cache=False)
        del ids
        mark("first forward, 8192 tokens (prefill shapes)")
        model.model(torch.randint(0, cfg.vocab_size, (1, 8192), device="cuda"), use_cache=False)
        mark("second forward, 8192 tokens")
        # The estimate's sizes: one token for each of 512 (then 504) sequences, so the GEMMs
        # run at M = 512 and 504; warm-up, then a graph, as profile_cudagraph_memory does.
        graphs = []
        pool = torch.cuda.graph_pool_handle()
        for n in (512, 504):
            ids = torch.randint(0, cfg.vocab_size, (n, 1), device="cuda")
            model.model(ids, use_cache=False)
            mark(f"eager warm-up, {n} sequences of 1 token")
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = model.model(ids, use_cache=False)
            graphs.append((g, ids, out))
            mark(f"graph captured, {n}")
        del graphs, out, ids
        gc.collect()
        torch.cuda.empty_cache()
        mark("graphs freed, cache emptied (the estimate's end)")
        # The real capture afterwards: every other V1 size, largest first.
        sizes = [1, 2, 4] + list(range(8, 513, 8))
        for n in sorted(set(sizes), reverse=True):
            ids = torch.randint(0, cfg.vocab_size, (n, 1), device="cuda")
            model.model(ids, use_cache=False)
        del ids
        gc.collect()
        torch.cuda.empty_cache()
        mark("eager passes at all 51 capture sizes")
    if len(sys.argv) > 1:
        save(sys.argv[1], steps)


if __name__ == "__main__":
    main()
