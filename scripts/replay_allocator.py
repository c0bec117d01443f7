"""Replays a vramscope trace through PyTorch's own CUDA caching allocator and compares the
reserved bytes after every event with what vramscope's model of that allocator recorded.

vramscope models c10's CUDACachingAllocator (src/memory/allocator.rs). Its fragmentation at a
peak is what the #9516 formula cannot see, so the model must be PyTorch's to the byte. This
script checks that on a GPU: it reads a trace written by
`vramscope profile ... --torch-snapshot F.pickle`, performs the same allocations and frees
with `torch.empty(size, dtype=torch.uint8)` in the same order (calling `torch.cuda.empty_cache()`
where the trace gives segments back), and prints where the two disagree.

Usage (on the GPU machine): python3 scripts/replay_allocator.py F.pickle [--json OUT.json]
"""

import argparse
import json
import pickle
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--json")
    args = ap.parse_args()
    with open(args.snapshot, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    torch.cuda.init()
    torch.cuda.empty_cache()
    base_reserved = torch.cuda.memory_reserved()
    if base_reserved:
        print(f"warning: {base_reserved} bytes reserved before the replay", file=sys.stderr)
    live = {}
    ours_reserved = 0
    ours_allocated = 0
    mismatches = 0
    first_mismatch = None
    max_diff = 0
    peak = {"allocated": -1}
    pending_empty = False
    events = 0
    for e in trace:
        action = e["action"]
        if action in ("segment_free", "segment_unmap"):
            ours_reserved -= e["size"]
            pending_empty = True
            continue
        if pending_empty:
            torch.cuda.empty_cache()
            pending_empty = False
        if action in ("segment_alloc", "segment_map"):
            ours_reserved += e["size"]
            continue
        if action == "alloc":
            live[e["addr"]] = torch.empty(e["size"], dtype=torch.uint8, device="cuda")
            ours_allocated += e["size"]
        elif action == "free_completed":
            t = live.pop(e["addr"], None)
            if t is None:
                continue
            del t
            ours_allocated -= e["size"]
        else:
            continue
        events += 1
        torch_reserved = torch.cuda.memory_reserved() - base_reserved
        torch_allocated = torch.cuda.memory_allocated()
        diff = torch_reserved - ours_reserved
        if diff != 0:
            mismatches += 1
            max_diff = max(max_diff, abs(diff))
            if first_mismatch is None:
                first_mismatch = {
                    "event": events,
                    "action": action,
                    "size": e["size"],
                    "torch_reserved": torch_reserved,
                    "vramscope_reserved": ours_reserved,
                    "frame": (e.get("frames") or [{}])[0].get("name", ""),
                }
        if torch_allocated > peak["allocated"]:
            peak = {
                "allocated": torch_allocated,
                "torch_reserved": torch_reserved,
                "vramscope_reserved": ours_reserved,
                "event": events,
            }
    if pending_empty:
        torch.cuda.empty_cache()
    final = {
        "torch_reserved": torch.cuda.memory_reserved() - base_reserved,
        "vramscope_reserved": ours_reserved,
        "torch_allocated": torch.cuda.memory_allocated(),
        "vramscope_allocated": ours_allocated,
    }
    out = {
        "events": events,
        "reserved_mismatches": mismatches,
        "max_abs_diff": max_diff,
        "first_mismatch": first_mismatch,
        "at_peak_allocated": peak,
        "final": final,
        "torch": torch.__version__,
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
