"""Peak bytes of the vision towers' norm bodies and pixel normalizations on a CUDA GPU.

Each body below restates, statement for statement, what a vLLM release runs eagerly (the
allocations depend on the statements, not on vLLM): forward_static (layernorm.py 0.19
L222-265), the IR native bodies (ir/ops/layernorm.py 0.21 L9-58), FusedInputNorm.forward
(models/vision.py 0.28 L709-733) and FusedMMInputNorm.forward_native (mm_input_norm.py 0.31
L285-301). For each: the bytes PyTorch's allocator holds at the op's peak beyond what was
allocated before it (inputs held by the caller), and what it leaves. Usage:
    python3 scripts/norm_probe.py --json OUT.json
"""
import argparse
import json

import torch


def static(x, w, eps):
    orig = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    x = x.to(orig)
    x = x * w
    return x


def ir(x, w, eps):
    orig = x.dtype
    x = x.to(torch.float32)
    x_var = x
    var = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    x = x.to(w.dtype) * w
    return x.to(orig)


def static_add(x, r, w, eps):
    orig = x.dtype
    x = x.to(torch.float32)
    x = x + r
    r = x.to(orig)
    x_var = x
    var = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    x = x.to(orig)
    x = x * w
    return x, r


def ir_add(x, r, w, eps):
    orig = x.dtype
    x = x.to(torch.float32)
    x = x + r.to(torch.float32)
    r = x.to(orig)
    x_var = x
    var = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    x = x.to(w.dtype) * w
    return x.to(orig), r


def upcast_norm(px, w, b, dtype):
    x = px.to(torch.float32)
    x = x.view(x.shape[0], 3, -1) * w.view(1, 3, 1) + b.view(1, 3, 1)
    return x.view(px.shape[0], -1).to(dtype)


def native_norm(px, w, b, dtype):
    x = px.reshape(px.shape[0], 3, -1)
    x = x * w.view(1, 3, 1) + b.view(1, 3, 1)
    return x.reshape(px.shape[0], -1).to(dtype)


def measure(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    left = torch.cuda.memory_allocated() - base
    del out
    return {"peak": peak, "left": left}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    dev = "cuda"
    t, d = 512, 1280
    x = torch.randn(t, d, device=dev, dtype=torch.bfloat16)
    r = torch.randn(t, d, device=dev, dtype=torch.bfloat16)
    w = torch.randn(d, device=dev, dtype=torch.bfloat16)
    p, s = 4096, 1176
    px = torch.randint(0, 256, (p, s), device=dev, dtype=torch.uint8)
    nw = torch.rand(3, device=dev, dtype=torch.float32)
    nb = torch.rand(3, device=dev, dtype=torch.float32)
    res = {
        "shape": [t, d],
        "pixels": [p, s],
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "static": measure(lambda: static(x, w, 1e-6)),
        "ir": measure(lambda: ir(x, w, 1e-6)),
        "static_add": measure(lambda: static_add(x, r, w, 1e-6)),
        "ir_add": measure(lambda: ir_add(x, r, w, 1e-6)),
        "upcast_norm": measure(lambda: upcast_norm(px, nw, nb, torch.bfloat16)),
        "native_norm": measure(lambda: native_norm(px, nw, nb, torch.bfloat16)),
    }
    print(json.dumps(res, indent=1))
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
