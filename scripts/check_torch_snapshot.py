#!/usr/bin/env python3
"""Checks a PyTorch memory snapshot written by `vramscope profile --torch-snapshot F.pickle`
with PyTorch's own viewer code, and with the invariants its browser part relies on.

    python3 scripts/check_torch_snapshot.py F.pickle [--viz PATH/_memory_viz.py]

1. torch.cuda._memory_viz: trace_plot and segment_plot (HTML written beside F), `stats`
   (segsum, which asserts that every segment's blocks add up to its size) and `trace`.
   Without torch installed, --viz names a copy of _memory_viz.py (it needs only the stdlib).
2. What MemoryViz.js does with the data (trace_plot's process_alloc_data, segment_plot's
   simulate_memory, replayed backwards from the end state): every free matches an alloc, and at
   every step every live block lies inside a live segment (otherwise the page throws).
Prints one line per check and exits 1 on the first failure.
"""
import argparse
import importlib.util
import pickle
import sys
from pathlib import Path


def load_viz(path):
    if path:
        spec = importlib.util.spec_from_file_location("_memory_viz", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    import torch.cuda._memory_viz as mod  # noqa: PLC0415

    return mod


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check_js_invariants(snap):
    for device, trace in enumerate(snap["device_traces"]):
        segs = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == device}
        blocks = {}
        for s in snap["segments"]:
            if s["device"] != device:
                continue
            addr = s["address"]
            for b in s["blocks"]:
                if b["state"] in ("active_allocated", "active_pending_free"):
                    blocks[addr] = b["size"]
                addr += b["size"]
            if addr != s["address"] + s["total_size"]:
                fail(f"segment {s['address']:#x}: blocks cover {addr - s['address']} of {s['total_size']} bytes")

        def inside(a):
            return any(base <= a < base + size for base, size in segs.items())

        # Forward: process_alloc_data pairs every free with its alloc.
        live = set()
        for e in trace:
            if e["action"] == "alloc":
                live.add(e["addr"])
            elif e["action"] == "free_completed":
                if e["addr"] not in live:
                    fail(f"device {device}: free_completed of {e['addr']:#x} with no alloc before it")
                live.discard(e["addr"])
        # Backward from the end state, as simulate_memory draws each step.
        for i in range(len(trace) - 1, -1, -1):
            e = trace[i]
            a = e.get("addr")
            act = e["action"]
            if act == "free_completed":
                blocks[a] = e["size"]
            elif act == "alloc":
                blocks.pop(a, None)
            elif act in ("segment_free", "segment_unmap"):
                segs[a] = e["size"]
            elif act in ("segment_alloc", "segment_map"):
                if a not in segs:
                    fail(f"device {device}: entry {i}: segment_alloc of {a:#x} not in the later state")
                del segs[a]
            for b in blocks:
                if not inside(b):
                    fail(f"device {device}: before entry {i}: block {b:#x} lies in no segment")
        print(f"ok: device {device}: {len(trace)} entries replay forwards and backwards")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--viz", help="path of a _memory_viz.py to use instead of torch's")
    args = ap.parse_args()
    viz = load_viz(args.viz)
    path = Path(args.snapshot)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    for name, fn in [("trace_plot", viz.trace_plot), ("segment_plot", viz.segment_plot)]:
        html = fn(snap)
        out = path.with_suffix(f".{name}.html")
        out.write_text(html)
        print(f"ok: {name} -> {out} ({len(html)} bytes)")
    stats = viz.segsum(snap)
    print("ok: stats: " + " | ".join(l for l in stats.splitlines() if l.startswith(("segments:", "total_"))))
    text = viz.trace(snap)
    print(f"ok: trace: {len(text.splitlines())} lines")
    check_js_invariants(snap)


if __name__ == "__main__":
    main()
