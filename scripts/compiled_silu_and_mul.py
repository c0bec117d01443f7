"""What vLLM's `SiluAndMul` allocates where its custom op is off (V1's default under Inductor).

From vLLM 0.15 a disabled custom op's `forward_native` is wrapped in
`torch.compile(fn, dynamic=True, backend="inductor")` (`CustomOp.maybe_compile`, 0.15.1
model_executor/custom_op.py L199-231; `SiluAndMul(compile_native=True)`, layers/activation.py
L130-131). vramscope models that as one [M, d] tensor, and 0.10/0.11's eager `forward_native`
as two (the `silu` temporary, then the product). This measures both on the GPU: the number of
the caching allocator's allocations during one call, and the peak above the input, for the
first (compiling) call and a later one at another size.

Run on a CUDA machine with PyTorch: `python3 scripts/compiled_silu_and_mul.py`.
"""

import torch
import torch.nn.functional as F


def forward_native(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def measure(fn, m: int, d: int) -> tuple[int, int, int]:
    x = torch.randn(m, 2 * d, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    allocs0 = stats["allocation.all.allocated"]
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - allocs0
    held = torch.cuda.memory_allocated() - base
    del out, x
    return allocs, peak, held


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    compiled = torch.compile(forward_native, dynamic=True, backend="inductor")
    for name, fn in (("eager forward_native", forward_native), ("inductor, dynamic", compiled)):
        for m, d in ((8192, 5632), (2048, 1408), (8192, 5632)):
            allocs, peak, held = measure(fn, m, d)
            out_bytes = m * d * 2
            print(
                f"{name:22} M={m:5} d={d:5}: {allocs} allocation(s), peak {peak} B "
                f"({peak / out_bytes:.2f} x the output), {held} B held after"
            )


if __name__ == "__main__":
    main()
