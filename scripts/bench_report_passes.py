#!/usr/bin/env python3
"""Times `vramscope report` with every export on a snapshot of many distinct passes (the
issue-26 case: 150,000 passes; each event's pass was found by a linear search).

    python3 scripts/bench_report_passes.py [PASSES] [VRAMSCOPE]

Writes the snapshot to a temporary folder (vramscope's own export frames: an op frame and a
`vramscope/pass` frame whose line is the pass), runs `report` with --json, --csv and --png,
and prints the file size, the wall time and the peak RSS (from /usr/bin/time-like rusage)."""
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time

passes = int(sys.argv[1]) if len(sys.argv) > 1 else 150_000
exe = sys.argv[2] if len(sys.argv) > 2 else "target/release/vramscope"
A = 0x7F3A_0000_0000
op = {"filename": "vramscope/activation/mlp", "line": 0, "name": "x"}
trace = [{"action": "segment_alloc", "addr": A, "size": 1 << 30, "stream": 0, "time_us": 0,
          "frames": []}]
for p in range(1, passes + 1):
    frames = [op, {"filename": "vramscope/pass", "line": p, "name": ""}]
    for action in ("alloc", "free_requested", "free_completed"):
        trace.append({"action": action, "addr": A, "size": 512, "stream": 0,
                      "time_us": p, "frames": frames})
snap = {"segments": [{"device": 0, "address": A, "total_size": 1 << 30, "stream": 0,
                      "segment_type": "large",
                      "blocks": [{"address": A, "size": 1 << 30, "state": "inactive"}]}],
        "device_traces": [trace]}
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "passes.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    size = os.path.getsize(path)
    outs = [os.path.join(d, n) for n in ("o.json", "o.csv", "o.png")]
    t = time.monotonic()
    r = subprocess.run([exe, "report", path, "--json", outs[0], "--csv", outs[1],
                        "--png", outs[2], "-q"], capture_output=True, text=True)
    wall = time.monotonic() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if r.returncode != 0:
        sys.exit(f"report failed ({r.returncode}): {r.stderr}")
    import json
    n = len(json.load(open(outs[0]))["passes"])
    print(f"{passes} passes, snapshot {size / 1e6:.1f} MB: report with JSON+CSV+PNG "
          f"{wall:.2f} s, peak RSS {rss / 2**20:.0f} MiB, {n} pass rows in the JSON")
