"""Replays a vramscope trace through PyTorch's own CUDA caching allocator and compares the
reserved bytes after every event with what vramscope's model of that allocator recorded.

vramscope models c10's CUDACachingAllocator (src/memory/allocator.rs). Its fragmentation at a
peak is what the #9516 formula cannot see, so the model must be PyTorch's to the byte. This
script checks that on a GPU: it reads a trace written by
`vramscope profile ... --torch-snapshot F.pickle`, performs the same allocations and frees
with `torch.empty(size, dtype=torch.uint8)` in the same order (calling `torch.cuda.empty_cache()`
where the trace gives segments back; setting `max_split_size_mb` where a marker of the trace
sets it, as vLLM does around its load and profile run), and prints where the two disagree.

Usage (on the GPU machine): python3 scripts/replay_allocator.py F.pickle [--json OUT.json]
[--ignore-max-split]
"""

import argparse
import json
import pickle
import sys

import torch


# How vramscope names a marker that sets the allocator's split limit (src/engine/runtime.rs
# `MAX_SPLIT_MARKER`), followed by the limit in MiB or "unlimited".
MAX_SPLIT_MARKER = "allocator max_split_size_mb:"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--json")
    ap.add_argument(
        "--stop-at-first-mismatch",
        action="store_true",
        help="stop there, with PyTorch's segments and blocks in the JSON (to compare layouts)",
    )
    ap.add_argument(
        "--ignore-max-split",
        action="store_true",
        help="leave PyTorch's split limit at its default (a control run)",
    )
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
    # Placement: each vramscope segment (trace base) paired with the PyTorch segment its first
    # block landed in; a block placed at another segment or offset is a divergence.
    vs_segs = {}  # trace base -> size
    t_segs = {}  # torch base -> size, in creation order
    t_seg_log = []  # (event, base, size, "alloc"|"free")
    pair_vs, pair_t = {}, {}
    first_placement = None

    def seg_of(segs, addr):
        for b, sz in segs.items():
            if b <= addr < b + sz:
                return b
        return None

    def torch_segments():
        return {s["address"]: s["total_size"] for s in torch.cuda.memory_snapshot()}

    splits = []

    def set_max_split(value):
        # As vLLM's `_scoped_allocator_max_split` does (0.28.0 v1/worker/gpu_worker.py
        # L291-312): "unlimited" is PyTorch's default, SIZE_MAX in MiB.
        mib = str((2**64 - 1) // (1024 * 1024)) if value == "unlimited" else value
        setting = f"max_split_size_mb:{mib}"
        if hasattr(torch._C, "_accelerator_setAllocatorSettings"):
            torch._C._accelerator_setAllocatorSettings(setting)
        else:
            torch.cuda.memory._set_allocator_settings(setting)
        splits.append((events, value))

    for trace_index, e in enumerate(trace):
        action = e["action"]
        if action == "snapshot":
            name = (e.get("frames") or [{}])[0].get("name", "")
            if name.startswith(MAX_SPLIT_MARKER) and not args.ignore_max_split:
                set_max_split(name[len(MAX_SPLIT_MARKER):])
            continue
        if action in ("segment_free", "segment_unmap"):
            ours_reserved -= e["size"]
            vs_segs.pop(e["addr"], None)
            tb = pair_vs.pop(e["addr"], None)
            if tb is not None:
                pair_t.pop(tb, None)
            pending_empty = True
            continue
        if pending_empty:
            torch.cuda.empty_cache()
            pending_empty = False
            now = torch_segments()
            for b in list(t_segs):
                if b not in now:
                    t_seg_log.append((events, b, t_segs.pop(b), "free"))
                    vb = pair_t.pop(b, None)
                    if vb is not None:
                        pair_vs.pop(vb, None)
        if action in ("segment_alloc", "segment_map"):
            ours_reserved += e["size"]
            vs_segs[e["addr"]] = e["size"]
            continue
        if action == "alloc":
            before = torch.cuda.memory_reserved()
            t = torch.empty(e["size"], dtype=torch.uint8, device="cuda")
            live[e["addr"]] = t
            ours_allocated += e["size"]
            if torch.cuda.memory_reserved() != before:
                now = torch_segments()
                for b, sz in now.items():
                    if b not in t_segs:
                        t_segs[b] = sz
                        t_seg_log.append((events + 1, b, sz, "alloc"))
            if first_placement is None:
                vb = seg_of(vs_segs, e["addr"])
                tb = seg_of(t_segs, t.data_ptr())
                ok = vb is not None and tb is not None
                if ok and vb in pair_vs:
                    ok = pair_vs[vb] == tb
                elif ok and tb in pair_t:
                    ok = False
                elif ok:
                    pair_vs[vb], pair_t[tb] = tb, vb
                ok = ok and (e["addr"] - vb == t.data_ptr() - tb)
                if not ok:
                    first_placement = {
                        "event": events + 1,
                        "size": e["size"],
                        "frame": (e.get("frames") or [{}])[0].get("name", ""),
                        "vramscope_segment": [hex(vb or 0), vs_segs.get(vb), e["addr"] - (vb or 0)],
                        "torch_segment": [hex(tb or 0), t_segs.get(tb), t.data_ptr() - (tb or 0)],
                        "torch_pair_of_vramscope_segment": hex(pair_vs.get(vb) or 0),
                    }
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
                    "trace_index": trace_index,
                }
                if args.stop_at_first_mismatch:
                    first_mismatch["torch_segments"] = [
                        {
                            "address": sg["address"],
                            "total_size": sg["total_size"],
                            "blocks": [(b["size"], b["state"]) for b in sg["blocks"]],
                        }
                        for sg in torch.cuda.memory_snapshot()
                    ]
                    first_mismatch["torch_address"] = t.data_ptr() if action == "alloc" else None
                    break
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
        "first_placement_divergence": first_placement,
        "torch_segments": [(ev, hex(b), sz, what) for ev, b, sz, what in t_seg_log],
        "at_peak_allocated": peak,
        "final": final,
        "max_split_settings": splits,
        "torch": torch.__version__,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "torch_segments"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
