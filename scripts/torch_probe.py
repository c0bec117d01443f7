"""PyTorch facts vramscope models, measured on the GPU machine (run there with its torch).

1. Where the cuBLAS / cuBLASLt workspaces come from: the caching allocator (and kept) or not.
2. vLLM 380e1863's sampler step (sampler.py L260-274, L417-443, L615-634, L821-824) replayed in
   torch on fp16 logits [S, Vp]: every allocation and free in order, and the peak over its input.
3. A real memory snapshot of a small transformers model (fixture for `vramscope report`).

Usage: python3 scripts/torch_probe.py OUT_DIR
"""
import json
import os
import subprocess
import sys

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "."


def workspace_probe(kind):
    torch.cuda.init()
    x = torch.randn(256, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if kind == "mm":
        y = torch.nn.functional.linear(x, w)
    else:
        y = torch.nn.functional.linear(x, w, b)
    torch.cuda.synchronize()
    out_bytes = y.numel() * y.element_size()
    after = torch.cuda.memory_allocated()
    peak = torch.cuda.max_memory_allocated()
    del y
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    # a second call: does anything new stay?
    y = torch.nn.functional.linear(x, w, b if kind != "mm" else None)
    del y
    torch.cuda.synchronize()
    kept2 = torch.cuda.memory_allocated() - before
    return dict(kind=kind, out_bytes=out_bytes, after_minus_before=after - before,
                peak_minus_before=peak - before, kept_after_free=kept, kept_after_second=kept2)


def sampler_replay(S, V, dtype=torch.float16):
    Vp = (V + 63) // 64 * 64
    torch.cuda.synchronize()
    logits_d = torch.randn(S, Vp, device="cuda", dtype=dtype)
    temperatures = torch.ones(S, device="cuda", dtype=dtype)
    top_ps = torch.full((S,), 0.99, device="cuda", dtype=dtype)
    top_ks = torch.full((S,), V - 1, device="cuda", dtype=torch.int)
    sample_indices = torch.arange(S, device="cuda", dtype=torch.int)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    logits = logits_d[..., :V]
    logits = logits.to(torch.float)
    logits.div_(temperatures.unsqueeze(dim=1))
    # _apply_top_k_top_p
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    top_k_mask = logits_sort.size(1) - top_ks.to(torch.long)
    top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
    top_k_mask = logits_sort < top_k_mask
    logits_sort.masked_fill_(top_k_mask, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = probs_sort.cumsum(dim=-1)
    top_p_mask = probs_sum <= 1 - top_ps.unsqueeze(dim=1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    new = torch.empty_like(logits_sort).scatter_(dim=-1, index=logits_idx, src=logits_sort)
    del logits_sort, logits_idx, top_k_mask, probs_sort, probs_sum, top_p_mask
    logits = new
    del new
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float)
    long_sample_indices = sample_indices.long()
    p = probs[long_sample_indices]
    q = torch.empty_like(p)
    q.exponential_()
    ids = p.div_(q).argmax(dim=1).view(-1, 1)
    del p, q
    ids_cpu = ids.cpu()
    del ids, probs, logprobs, logits, long_sample_indices
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated() - base
    trace = []
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_completed"):
            top = e["frames"][0] if e["frames"] else {}
            trace.append([e["action"], e["size"], top.get("name", ""), top.get("line", 0)])
    return dict(S=S, V=V, Vp=Vp, N=S * V, peak_over_input=peak,
                peak_per_element=peak / (S * V), trace=trace, first_ids=ids_cpu[:4, 0].tolist())


def sort_probe(S, V):
    x = torch.randn(S, V, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    v, i = x.sort(dim=-1)
    torch.cuda.synchronize()
    return dict(S=S, V=V, peak_per_element=(torch.cuda.max_memory_allocated() - base) / (S * V),
                peak_bytes=torch.cuda.max_memory_allocated() - base)


def fixture():
    from transformers import OPTConfig, OPTForCausalLM
    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, ffn_dim=256,
                    num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=64)
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    model = OPTForCausalLM(cfg).to("cuda", torch.float16).eval()
    ids = torch.randint(0, 1000, (2, 32), device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            out = model(ids).logits
            del out
    torch.cuda.synchronize()
    nums = dict(max_memory_allocated=torch.cuda.max_memory_allocated(),
                memory_allocated=torch.cuda.memory_allocated(),
                memory_reserved=torch.cuda.memory_reserved(),
                torch=torch.__version__)
    path = os.path.join(OUT, "opt_tiny_3passes.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    nums["bytes"] = os.path.getsize(path)
    # A ring buffer that dropped its oldest entries: blocks alive at the first entry come
    # from `segments`.
    torch.cuda.memory._record_memory_history(max_entries=40, stacks="python")
    with torch.inference_mode():
        out = model(ids).logits
        keep = out.float()
        del out
    torch.cuda.synchronize()
    ring = dict(max_memory_allocated=torch.cuda.max_memory_allocated(),
                memory_allocated=torch.cuda.memory_allocated(),
                memory_reserved=torch.cuda.memory_reserved())
    path2 = os.path.join(OUT, "opt_tiny_ring40.pickle")
    torch.cuda.memory._dump_snapshot(path2)
    torch.cuda.memory._record_memory_history(enabled=None)
    ring["bytes"] = os.path.getsize(path2)
    del keep
    return dict(full=nums, ring=ring)


if __name__ == "__main__" and len(sys.argv) > 2:
    # child: one probe in a fresh process
    if sys.argv[2] == "fixture":
        print(json.dumps(fixture()))
    else:
        print(json.dumps(workspace_probe(sys.argv[2])))
    sys.exit(0)

if __name__ == "__main__":
    res = dict(torch=torch.__version__, cuda=torch.version.cuda,
               cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
               device=torch.cuda.get_device_name(0))
    res["workspace"] = []
    for kind in ("mm", "linear_bias"):
        p = subprocess.run([sys.executable, __file__, OUT, kind], capture_output=True, text=True)
        res["workspace"].append(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else p.stderr[-2000:])
    res["sort"] = [sort_probe(S, V) for S, V in [(1, 128256), (64, 128256), (128, 128256), (256, 128256), (256, 50272)]]
    res["sampler"] = [sampler_replay(256, 50272), sampler_replay(256, 128256), sampler_replay(256, 128256, torch.bfloat16)]
    # The fixture in a fresh process, so its peak is the recorded run's own.
    p = subprocess.run([sys.executable, __file__, OUT, "fixture"], capture_output=True, text=True)
    res["fixture"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else p.stderr[-2000:]
    with open(os.path.join(OUT, "torch_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    short = {k: v for k, v in res.items() if k != "sampler"}
    short["sampler"] = [{k: v for k, v in s.items() if k != "trace"} for s in res["sampler"]]
    print(json.dumps(short, indent=1))
