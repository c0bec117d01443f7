#!/usr/bin/env python3
"""PyTorch + transformers reference for vramscope's CUDA backend.

  logits  --model DIR [--tokens N --seqs S --dtype fp16 --json OUT]
      Loads the safetensors written by `vramscope gen-model` with transformers (sdpa
      attention) on the GPU and writes the last-token logits of each sequence for the same
      dummy batch vramscope runs (ids (i*7919+13) % vocab, sequences split as evenly as vLLM).
  bench   [--preset llama-3-8b --tokens 8192 --dtype fp16 --iters 3 --json OUT]
      Times one forward pass of that shape (random weights, one sequence, logits of the last
      token only), as `vramscope bench` does, and reports TFLOP/s with the same FLOP count.
      --kernels adds a profiled pass (GPU time per kernel and kind) and sdpa timed alone.
      --preset qwen3-30b-a3b builds transformers' Qwen3MoeForCausalLM (128 experts of width
      768, 8 a token; its experts loop over the experts a batch hits) as the MoE reference.
  compare A.json B.json
      Relative L2 error of A's logits against B's.
"""
import argparse
import json
import math
import sys
import time

PRESETS = {
    # hidden, intermediate, layers, heads, kv heads, vocab, rope theta, eps, tied
    "llama-3-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0, 1e-5, False),
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 100000.0, 1e-5, True),
    "tiny": (128, 384, 4, 4, 2, 1024, 10000.0, 1e-5, False),
}
# Mixture of experts: the same fields (intermediate = each expert's width), then experts, top-k,
# head_dim.
MOE_PRESETS = {
    "qwen3-30b-a3b": (2048, 768, 48, 32, 4, 151936, 1000000.0, 1e-6, False, 128, 8, 128),
}


def dummy_batch(tokens, seqs, vocab):
    base = tokens // seqs
    lens = [base + (1 if i < tokens % seqs else 0) for i in range(seqs)]
    ids = [(i * 7919 + 13) % vocab for i in range(tokens)]
    return ids, lens


def flops(h, inter, layers, heads, kv, vocab, lens, hd=None, topk=1, experts=0):
    """The pass's FLOPs; for a MoE model `inter` is an expert's width, `topk` experts a token,
    and the router's `experts` columns are counted."""
    hd = hd or h // heads
    t = sum(lens)
    linear = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter * topk + h * experts
    pairs = sum(n * (n + 1) / 2 for n in lens)
    attn = 4.0 * heads * hd * pairs
    return layers * (2.0 * t * linear + attn) + 2.0 * len(lens) * h * vocab


def torch_dtype(name):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def cmd_logits(a):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch_dtype(a.dtype), attn_implementation="sdpa"
    ).to("cuda")
    model.eval()
    vocab = model.config.vocab_size
    ids, lens = dummy_batch(a.tokens, a.seqs, vocab)
    out = []
    start = 0
    with torch.inference_mode():
        for n in lens:
            x = torch.tensor([ids[start : start + n]], device="cuda")
            logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits
            out.extend(logits[0, -1].float().cpu().tolist())
            start += n
    res = {"source": "pytorch+transformers sdpa", "model": a.model, "dtype": a.dtype,
           "tokens": a.tokens, "seqs": a.seqs, "logits": out}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    print(f"pytorch logits: {len(out)} values, first {out[:3]}")


def cmd_bench(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    moe = a.preset in MOE_PRESETS
    if moe:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        h, inter, layers, heads, kv, vocab, theta, eps, tied, experts, topk, hd = MOE_PRESETS[a.preset]
        cfg = Qwen3MoeConfig(hidden_size=h, intermediate_size=6144, moe_intermediate_size=inter,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv, head_dim=hd, vocab_size=vocab,
                             num_experts=experts, num_experts_per_tok=topk, norm_topk_prob=True,
                             rope_theta=theta, rms_norm_eps=eps, tie_word_embeddings=tied,
                             max_position_embeddings=max(40960, a.tokens))
        build = Qwen3MoeForCausalLM
    else:
        h, inter, layers, heads, kv, vocab, theta, eps, tied = PRESETS[a.preset]
        experts, topk, hd = 0, 1, h // heads
        cfg = LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                          rope_theta=theta, rms_norm_eps=eps, tie_word_embeddings=tied,
                          max_position_embeddings=max(8192, a.tokens))
        build = LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    dt = torch_dtype(a.dtype)
    torch.set_default_dtype(dt)
    t0 = time.time()
    with torch.device("cuda"):
        model = build(cfg)
    model.eval()
    torch.set_default_dtype(torch.float32)
    torch.cuda.synchronize()
    load_s = time.time() - t0
    ids, lens = dummy_batch(a.tokens, 1, vocab)
    x = torch.tensor([ids], device="cuda")
    times = []
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        for it in range(a.iters + 1):
            torch.cuda.synchronize()
            s = time.perf_counter()
            model(input_ids=x, use_cache=False, logits_to_keep=1)
            torch.cuda.synchronize()
            if it > 0:
                times.append((time.perf_counter() - s) * 1e3)
    times.sort()
    med = times[len(times) // 2]
    if a.kernels:
        kernel_table(lambda: model(input_ids=x, use_cache=False, logits_to_keep=1))
        sdpa_alone(h, heads, kv, a.tokens, dt)
    f = flops(h, inter, layers, heads, kv, vocab, lens, hd, topk, experts)
    res = {"source": "pytorch+transformers sdpa", "preset": a.preset, "dtype": a.dtype,
           "tokens": a.tokens, "pass_ms": times, "median_ms": med, "flops": f,
           "tflops": f / (med * 1e-3) / 1e12, "init_s": load_s,
           "max_allocated_bytes": torch.cuda.max_memory_allocated(),
           "torch": torch.__version__}
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh)
    print(f"pytorch {a.preset} {a.dtype} {a.tokens} tokens: median {med:.2f} ms of "
          f"{[round(t, 2) for t in times]}, {res['tflops']:.1f} TFLOP/s, "
          f"peak allocated {res['max_allocated_bytes']} B (torch {torch.__version__})")


def kernel_table(step):
    """One profiled pass: GPU time per kernel, and per kind (GEMM, attention, other)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kinds = {}
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us <= 0:
            continue
        n = e.key.lower()
        kind = ("attention" if any(w in n for w in ("flash", "fmha", "attention", "sdpa", "cudnn"))
                else "gemm" if any(w in n for w in ("gemm", "xmma", "cutlass", "sm90_", "nvjet"))
                else "other")
        kinds[kind] = kinds.get(kind, 0) + us
        rows.append((us, e.count, kind, e.key[:110]))
    rows.sort(reverse=True)
    total = sum(kinds.values())
    print(f"pytorch kernels in one pass: {total / 1e3:.2f} ms of GPU time")
    for k, us in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<10} {us / 1e3:9.2f} ms {100 * us / total:5.1f} %")
    for us, count, kind, key in rows[:30]:
        print(f"  {us / 1e3:9.2f} ms {count:5d}x {kind:<9} {key}")


def sdpa_alone(h, heads, kv, tokens, dt):
    """Causal sdpa of one layer's shape, timed alone (32 calls), GQA through enable_gqa."""
    import torch
    import torch.nn.functional as F

    hd = h // heads
    q = torch.randn(1, heads, tokens, hd, device="cuda", dtype=dt)
    k = torch.randn(1, kv, tokens, hd, device="cuda", dtype=dt)
    v = torch.randn(1, kv, tokens, hd, device="cuda", dtype=dt)
    for gqa in (True, False):
        kk = k if gqa else k.repeat_interleave(heads // kv, 1)
        vv = v if gqa else v.repeat_interleave(heads // kv, 1)
        for _ in range(3):
            F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
        torch.cuda.synchronize()
        s = time.perf_counter()
        for _ in range(32):
            F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - s) * 1e3
        fl = 32 * 4.0 * heads * hd * tokens * (tokens + 1) / 2
        print(f"sdpa alone, enable_gqa={gqa}: {ms:.2f} ms for 32 layers, {fl / ms / 1e9:.1f} TFLOP/s")


def cmd_compare(a):
    with open(a.a) as f:
        x = json.load(f)["logits"]
    with open(a.b) as f:
        y = json.load(f)["logits"]
    if len(x) != len(y):
        sys.exit(f"{a.a} has {len(x)} logits, {a.b} has {len(y)}")
    num = sum((p - q) ** 2 for p, q in zip(x, y))
    den = sum(q * q for q in y)
    err = math.sqrt(num / den) if den > 0 else float("inf")
    print(f"relative L2 error {a.a} vs {a.b}: {err:.3e}")
    if a.max is not None and not err < a.max:
        sys.exit(f"error {err:.3e} is over {a.max}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    l = sub.add_parser("logits")
    l.add_argument("--model", required=True)
    l.add_argument("--tokens", type=int, default=64)
    l.add_argument("--seqs", type=int, default=1)
    l.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    l.add_argument("--json")
    b = sub.add_parser("bench")
    b.add_argument("--preset", default="llama-3-8b", choices=sorted(PRESETS) + sorted(MOE_PRESETS))
    b.add_argument("--tokens", type=int, default=8192)
    b.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    b.add_argument("--iters", type=int, default=3)
    b.add_argument("--json")
    b.add_argument("--kernels", action="store_true",
                   help="also profile one pass (GPU time per kernel) and time sdpa alone")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--max", type=float)
    a = p.parse_args()
    {"logits": cmd_logits, "bench": cmd_bench, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    main()
