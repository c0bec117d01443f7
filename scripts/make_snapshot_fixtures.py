#!/usr/bin/env python3
"""Writes the synthetic PyTorch memory snapshots under tests/fixtures/ with Python's own pickle,
in the structure torch.cuda.memory._snapshot() returns (PyTorch 2.1-2.11): shared frame dicts
(as PyTorch's symbolize shares them), free_requested/free_completed pairs, a large block whose
remainder is too small to split, and entries of actions vramscope skips or marks.

The numbers the tests assert are worked out by hand in the comments below.

    python3 scripts/make_snapshot_fixtures.py
"""
import pickle
from pathlib import Path

MIB = 1 << 20
A = 0x7F3A_0000_0000  # a 2 MiB small-pool segment
B = A + 2 * MIB  # a 20 MiB large-pool segment

user = {"filename": "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py",
        "line": 178, "name": "forward"}
mlp = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
       "line": 125, "name": "forward"}
cpp = {"filename": "??", "line": 0, "name": "CapturedTraceback::gather"}
stack_a = [cpp, user]
stack_b = [cpp, mlp, user]


def entry(action, addr, size, t, frames=()):
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": 1_700_000_000_000_000 + t, "frames": list(frames)}


# a1: 1000 B -> block 1024; a2: 4096 B -> 4096 (small pool, split).
# b1: 19.5 MiB in a fresh 20 MiB segment: 0.5 MiB left <= 1 MiB, not split -> block 20 MiB.
# Peak allocated = 1024 + 4096 + 20 MiB = 20_976_640.
# b2: 3 MiB in the freed 20 MiB block: 17 MiB left > 1 MiB -> split, block 3 MiB.
# End: a2 (4096) + b2 (3 MiB) = 3_149_824 allocated; 22 MiB = 23_068_672 reserved.
trace = [
    entry("segment_alloc", A, 2 * MIB, 0, stack_a),
    entry("alloc", A, 1000, 1, stack_a),
    entry("alloc", A + 1024, 4096, 2, stack_b),
    entry("segment_alloc", B, 20 * MIB, 3, stack_b),
    entry("alloc", B, 19 * MIB + MIB // 2, 4, stack_b),
    {"action": "annotate", "addr": B, "size": 0, "stream": 0, "time_us": 1_700_000_000_000_005,
     "user_metadata": "kv", "frames": []},
    entry("free_requested", B, 19 * MIB + MIB // 2, 6, stack_b),
    entry("free_completed", B, 19 * MIB + MIB // 2, 7, stack_b),
    entry("alloc", B, 3 * MIB, 8, stack_b),
    entry("free_requested", A, 1000, 9, stack_a),
    entry("free_completed", A, 1000, 10, stack_a),
    {"action": "oom", "device_free": 123, "size": 64 * MIB, "stream": 0,
     "time_us": 1_700_000_000_000_011, "frames": stack_b},
    {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 1_700_000_000_000_012,
     "frames": []},
]

segments = [
    {"device": 0, "address": A, "total_size": 2 * MIB, "allocated_size": 4096, "active_size": 4096,
     "requested_size": 4096, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
     "is_expandable": False, "frames": stack_a,
     "blocks": [
         {"address": A, "size": 1024, "requested_size": 1000, "state": "inactive", "frames": []},
         {"address": A + 1024, "size": 4096, "requested_size": 4096, "state": "active_allocated",
          "frames": stack_b},
         {"address": A + 5120, "size": 2 * MIB - 5120, "requested_size": 0, "state": "inactive",
          "frames": []},
     ]},
    {"device": 0, "address": B, "total_size": 20 * MIB, "allocated_size": 3 * MIB,
     "active_size": 3 * MIB, "requested_size": 3 * MIB, "stream": 0, "segment_type": "large",
     "segment_pool_id": (0, 0), "is_expandable": False, "frames": stack_b,
     "blocks": [
         {"address": B, "size": 3 * MIB, "requested_size": 3 * MIB, "state": "active_allocated",
          "frames": stack_b},
         {"address": B + 3 * MIB, "size": 17 * MIB, "requested_size": 0, "state": "inactive",
          "frames": []},
     ]},
]

settings = {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False, "roundup_power2_divisions": {"1": 0}}

full = {"segments": segments, "device_traces": [trace], "allocator_settings": settings,
        "external_annotations": [{"device": 0, "stage": "START", "name": "forward pass",
                                  "time_us": 1_700_000_000_000_001}]}

# The same run seen through a ring buffer that dropped the first three entries: segment A and
# blocks a1 (freed later) and a2 (alive at the end) predate the history; a1's size is the
# rounded request (1024) since its segment's layout before the history is unknown.
# Before the first entry: allocated 1024 + 4096 = 5120, reserved 2 MiB.
# Peak = 5120 + 20 MiB = 20_976_640 again; end as above.
truncated = dict(full, device_traces=[trace[3:]], external_annotations=[])

out = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
out.mkdir(parents=True, exist_ok=True)
for name, data in [("snapshot_small.pickle", full), ("snapshot_truncated.pickle", truncated)]:
    with open(out / name, "wb") as f:
        pickle.dump(data, f)
    print(out / name)
