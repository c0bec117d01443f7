#!/usr/bin/env python3
"""Replays one fused-MoE block of vLLM 0.8.5 (V0, eager, 16-bit weights, one GPU, inplace) with
PyTorch's caching allocator on the GPU, and prints its peak over what was allocated before it:
tests/moe.rs `one_moe_block_peaks_where_pytorch_replaying_vllm_peaks` holds vramscope's dry
run of the same block to that byte.

vLLM is not installed on the GPU machine, so the block's PyTorch-level allocations are made
here in its order with its shapes (model_executor/layers/fused_moe/fused_moe.py at 0.8.5):
the router's F.linear (L1 below), fused_topk's three torch.empty and `gating_output.float()`
(L863-876), the renormalisation's sum and division (L839-840), fused_experts_impl's cache13
and cache2 (L1295-1304), moe_align_block_size's sorted_ids (filled), expert_ids (zeros) and
num_tokens_post_pad (moe_align_block_size.py L201-216), then the frees in the order the
functions return. vLLM's kernels (topk_softmax, moe_align_block_size, the Triton GEMMs,
moe_sum) write into those tensors and allocate nothing for these expert counts (powers of two
up to 256; csrc/moe at 0.8.5), so they are not called.

Usage: python3 scripts/moe_replay.py E TOPK HIDDEN WIDTH TOKENS RENORMALIZE BLOCK_M
       (Qwen3-30B-A3B at 8192 tokens on an H200: 128 8 2048 768 8192 1 128)
"""
import json
import sys

import torch
import torch.nn.functional as F

E, K, H, I, M, RENORM, B = (int(a) for a in sys.argv[1:8])
dev, dt = "cuda", torch.bfloat16
CHUNK = 32768
x = torch.empty(M, H, dtype=dt, device=dev).normal_()
gate = torch.empty(E, H, dtype=dt, device=dev).normal_()
w13 = torch.empty(E, 2 * I, H, dtype=dt, device=dev)
w2 = torch.empty(E, H, I, dtype=dt, device=dev)
# cuBLAS's workspace comes from the caching allocator on the first matmul: made before the
# baseline, as vramscope's `ensure_library_workspaces`.
F.linear(x[:1], gate)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
base = torch.cuda.memory_allocated()

router_logits = F.linear(x, gate)
topk_weights = torch.empty(M, K, dtype=torch.float32, device=dev)
topk_ids = torch.empty(M, K, dtype=torch.int32, device=dev)
token_expert_indicies = torch.empty(M, K, dtype=torch.int32, device=dev)
gating_output_float = router_logits.float()
if E & (E - 1) or E > 256:
    workspace = torch.empty(M * E, dtype=torch.float32, device=dev)
    del workspace
topk_weights.uniform_(0.01, 1.0)
if RENORM:
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
del token_expert_indicies
del gating_output_float
m_c = min(M, CHUNK)
n = 2 * I
cache13 = torch.empty(m_c * K * max(n, H), dtype=dt, device=dev)
cache2 = torch.empty(m_c * K, n // 2, dtype=dt, device=dev)
t = M
padded = t * K + E * (B - 1)
sorted_ids = torch.empty(padded, dtype=torch.int32, device=dev)
sorted_ids.fill_(t * K)
expert_ids = torch.zeros((padded + B - 1) // B, dtype=torch.int32, device=dev)
num_tokens_post_pad = torch.empty(1, dtype=torch.int32, device=dev)
torch.cuda.synchronize()
at_peak = torch.cuda.memory_allocated() - base
del cache13, sorted_ids, expert_ids, num_tokens_post_pad, cache2
del topk_weights, topk_ids
del router_logits
torch.cuda.synchronize()
print(json.dumps({
    "torch": torch.__version__,
    "gpu": torch.cuda.get_device_name(),
    "experts": E, "top_k": K, "hidden": H, "width": I, "tokens": M, "block_m": B,
    "peak_over_input": torch.cuda.max_memory_allocated() - base,
    "allocated_inside_experts": at_peak,
    "left_after": torch.cuda.memory_allocated() - base,
}))
