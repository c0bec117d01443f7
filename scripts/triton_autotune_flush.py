"""What a Triton autotune's benchmark takes from PyTorch's caching allocator.

vLLM 0.19's Qwen3-Next GDN layers warm their prefill kernels up inside the profile pass
(0.19.0 model_executor/layers/mamba/gdn_linear_attn.py L567-665); off SM 9.0 those are
FLA's `@triton.autotune`d kernels, whose first call benchmarks every config with
`triton.testing.do_bench`. This measures what that benchmark adds to
`torch.cuda.max_memory_allocated()` above what is live, for a plain `do_bench` and for the
first and a second call of an autotuned kernel, and what stays allocated after.

Run on a CUDA machine with PyTorch (Triton comes with it):
`python3 scripts/triton_autotune_flush.py`.
"""

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024) for w in (2, 4)],
    key=["n"],
)
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


def launch(x: torch.Tensor, y: torch.Tensor) -> None:
    n = x.numel()
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)


def above(fn) -> tuple[int, int]:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base


def main() -> None:
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    peak, held = above(lambda: launch(x, y))
    print(f"autotuned kernel, first call (benchmarks 4 configs): peak +{peak} B, held +{held} B")
    peak, held = above(lambda: launch(x, y))
    print(f"autotuned kernel, second call: peak +{peak} B, held +{held} B")
    peak, held = above(lambda: triton.testing.do_bench(lambda: launch(x, y), warmup=1, rep=1))
    print(f"triton.testing.do_bench of the tuned kernel: peak +{peak} B, held +{held} B")
    print(f"reserved after: {torch.cuda.memory_reserved()} B")


if __name__ == "__main__":
    main()
