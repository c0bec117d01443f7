"""Measures the device memory NCCL takes per rank, outside PyTorch's caching allocator, for the
collectives vLLM's tensor parallelism uses (issue 11's model of NCCL memory starts here).

Two processes, one GPU each (run it on the nvidia-h200-x2 machine). At each step every rank
prints: device used (cuMemGetInfo), this process's NVML used memory, and PyTorch's allocated
and reserved bytes; "outside" = NVML process memory − reserved, i.e. the CUDA context plus
whatever NCCL (and cuBLAS) took directly. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and
friends, as the machine's notes require).

Usage: python3 scripts/nccl_memory_probe.py [--json OUT.json]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def snapshot(rank, step, handle):
    import pynvml

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    used_by_me = 0
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == os.getpid():
            used_by_me = p.usedGpuMemory or 0
    reserved = torch.cuda.memory_reserved()
    return {
        "rank": rank,
        "step": step,
        "device_used": total - free,
        "process_used": used_by_me,
        "allocated": torch.cuda.memory_allocated(),
        "reserved": reserved,
        "outside": used_by_me - reserved,
    }


def worker(rank, world, port, out):
    import pynvml

    pynvml.nvmlInit()
    torch.cuda.set_device(rank)
    handle = pynvml.nvmlDeviceGetHandleByIndex(rank)
    rows = []
    torch.zeros(1, device="cuda")
    rows.append(snapshot(rank, "context", handle))
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    rows.append(snapshot(rank, "init_process_group", handle))
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    assert x.item() == world
    rows.append(snapshot(rank, "first all_reduce (4 B): communicator made", handle))
    for mib in (1, 64, 512):
        y = torch.ones(mib << 19, dtype=torch.float16, device="cuda")
        dist.all_reduce(y)
        assert y[0].item() == world
        del y
        rows.append(snapshot(rank, f"all_reduce {mib} MiB fp16", handle))
    # vLLM's tensor_model_parallel_gather of the logits to rank 0 (torch.distributed.gather):
    # NCCL point-to-point, which sets up its own connections.
    z = torch.full((256, 64128), float(rank), dtype=torch.float16, device="cuda")
    g = [torch.empty_like(z) for _ in range(world)] if rank == 0 else None
    dist.gather(z, g, dst=0)
    if rank == 0:
        assert g[1][0, 0].item() == 1.0
    del z, g
    rows.append(snapshot(rank, "gather [256, 64128] fp16 to rank 0", handle))
    torch.cuda.empty_cache()
    rows.append(snapshot(rank, "empty_cache", handle))
    dist.destroy_process_group()
    rows.append(snapshot(rank, "destroy_process_group", handle))
    out.put(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    world = torch.cuda.device_count()
    if world < 2:
        print(f"needs 2 GPUs, sees {world}", file=sys.stderr)
        return 2
    world = 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, 29533, q)) for r in range(world)]
    for p in procs:
        p.start()
    rows = [r for _ in procs for r in q.get(timeout=300)]
    for p in procs:
        p.join()
    rows.sort(key=lambda r: (r["rank"]))
    base = {r["rank"]: r["outside"] for r in rows if r["step"] == "context"}
    for r in rows:
        r["outside_over_context"] = r["outside"] - base[r["rank"]]
        print(
            f"rank {r['rank']} {r['step']:<45} outside {r['outside'] / 2**20:9.1f} MiB"
            f" (+{r['outside_over_context'] / 2**20:8.1f} over the context)"
            f" reserved {r['reserved'] / 2**20:8.1f} MiB"
        )
    out = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
