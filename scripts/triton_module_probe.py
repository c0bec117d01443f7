"""Measures the device memory each Triton kernel takes outside PyTorch's allocator when it is
first launched (its module loaded by the CUDA driver), in a PyTorch process: the question
behind the non-torch memory a vLLM release with many Triton kernels (Model Runner V2's input
preparation, block tables and sampler; Inductor's fused kernels) adds after its baseline
(issue 46).

Each kernel is one `@triton.jit` function compiled for a distinct constexpr, so each launch
compiles and loads a module of its own. After every step it prints the device memory in use
(`cudaMemGetInfo`) less PyTorch's reserved bytes.

Usage (on the GPU machine): python3 scripts/triton_module_probe.py [--json OUT.json]
"""

import argparse
import json

import torch
import triton
import triton.language as tl


@triton.jit
def small(x_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m)
    tl.store(x_ptr + i, x * K + 1.0, mask=m)


@triton.jit
def larger(x_ptr, y_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr):
    # A reduction and several elementwise steps: more code than `small`, about a fused
    # RMSNorm's.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
    v = tl.sum(x * x, axis=0) / n
    r = 1.0 / tl.sqrt(v + 1e-6)
    y = x * r * K
    y = tl.where(y > 0, y, y * 0.01)
    tl.store(y_ptr + row * n + cols, y.to(tl.float16), mask=m)


def outside():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    x = torch.zeros(1 << 20, device="cuda", dtype=torch.float32)
    a = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    b = torch.empty_like(a)
    base = outside()
    rows = [("start", 0, base)]
    done = 0
    for target in (1, 2, 5, 10, 20, 40, 80):
        while done < target:
            small[(x.numel() // 1024,)](x, x.numel(), K=float(done + 2), BLOCK=1024)
            done += 1
        rows.append(("small", done, outside()))
    done_l = 0
    for target in (1, 10, 40):
        while done_l < target:
            larger[(a.shape[0],)](a, b, a.shape[1], K=float(done_l + 2), BLOCK=4096)
            done_l += 1
        rows.append(("larger", done_l, outside()))
    for what, n, o in rows:
        print(f"{what:7s} {n:3d} kernels: outside PyTorch {o / 2**20:9.2f} MiB ({(o - base) / 2**20:+.2f})")
    out = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name(0),
        "rows": [{"kind": w, "kernels": n, "outside_bytes": o} for w, n, o in rows],
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
