"""Check vramscope's GPU sampler against PyTorch on the same logits.

`vramscope bench --device cuda:0 --sampler-dump DIR` writes the f32 logits the sampler started
from (its first rows, after `.to(float)` and the temperature divide), the probs it computed and
sampler.json. This script runs vLLM 380e1863's `_apply_top_k_top_p` (sampler.py L417-443) and
`torch.softmax` (L272) on the same logits with PyTorch and prints the largest difference.

Usage: python3 scripts/sampler_reference.py DIR
"""
import json
import sys

import numpy as np
import torch

d = sys.argv[1]
meta = json.load(open(f"{d}/sampler.json"))
rows, vocab = meta["rows"], meta["vocab"]
logits = torch.from_numpy(np.fromfile(f"{d}/logits.f32", dtype="<f4").reshape(rows, vocab)).cuda()
ours = torch.from_numpy(np.fromfile(f"{d}/probs.f32", dtype="<f4").reshape(rows, vocab)).cuda()
# SamplingTensors are in the model's logits dtype; top_k = vocab - 1, top_p = 0.99.
dtype = torch.bfloat16 if meta["quant"] == "bf16" else torch.float16
p = torch.full((rows,), 0.99, device="cuda", dtype=dtype)
k = torch.full((rows,), vocab - 1, device="cuda", dtype=torch.int)
logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
top_k_mask = logits_sort.size(1) - k.to(torch.long)
top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
top_k_mask = logits_sort < top_k_mask
logits_sort.masked_fill_(top_k_mask, -float("inf"))
probs_sort = logits_sort.softmax(dim=-1)
probs_sum = probs_sort.cumsum(dim=-1)
top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
top_p_mask[:, -1] = False
logits_sort.masked_fill_(top_p_mask, -float("inf"))
new = torch.empty_like(logits_sort).scatter_(dim=-1, index=logits_idx, src=logits_sort)
probs = torch.softmax(new, dim=-1, dtype=torch.float)
err = (probs - ours).abs().max().item()
kept_theirs = (probs > 0).sum(dim=-1).tolist()
kept_ours = (ours > 0).sum(dim=-1).tolist()
print(json.dumps(dict(meta, max_abs_error=err, max_prob=probs.max().item(),
                      kept_torch=kept_theirs, kept_vramscope=kept_ours,
                      torch=torch.__version__)))
