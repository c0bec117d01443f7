"""What CUDA graphs leave outside PyTorch's allocator once captured and destroyed (issue 46).

After `nontorch_estimate_probe.py` showed the process's memory outside the caching allocator
growing by 74 MiB at the first graph capture and staying after the graphs were destroyed,
this script asks whether that is a one-time cost of the first capture or grows with the
graphs: a one-kernel graph first, then 100 of them, then graphs of 40 and 400 kernels, each
destroyed, reading the process's memory outside the allocator (cudaMemGetInfo's used less
`memory_reserved`) after every step.

Usage: python3 scripts/graph_driver_probe.py [OUT.json]
"""
import gc
import sys

import torch

from nontorch_estimate_probe import recorder, save


def main():
    steps, mark = recorder()
    torch.cuda.init()
    x = torch.ones(1 << 20, device="cuda")
    x.add_(1)
    torch.cuda.synchronize()
    mark("context, one kernel run")

    def capture(kernels):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                for _ in range(kernels):
                    x.add_(1)
        torch.cuda.synchronize()
        return g

    g = capture(1)
    mark("one graph of 1 kernel captured")
    g.replay()
    mark("replayed")
    del g
    gc.collect()
    mark("destroyed")
    gs = [capture(1) for _ in range(100)]
    mark("100 graphs of 1 kernel")
    del gs
    gc.collect()
    mark("destroyed")
    for k in (40, 400, 4000):
        g = capture(k)
        g.replay()
        mark(f"one graph of {k} kernels, replayed")
        del g
        gc.collect()
        torch.cuda.empty_cache()
        mark("destroyed")
    if len(sys.argv) > 1:
        save(sys.argv[1], steps)


if __name__ == "__main__":
    main()
