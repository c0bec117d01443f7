# One line per profile JSON report: the model, the vLLM answer's KV blocks, the graphs' pool,
# own memory, side stream, took and estimate, and the pool's allocation count; the large
# event list is dropped (used on the GPU machine, whose reports are too large to bring back).
import json, sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    g = d.get("graphs") or {}
    pool_allocs = sum(1 for e in d.get("events", []) if e.get("category") == "cuda-graph")
    print(json.dumps({
        "model": d.get("model", {}).get("name") if isinstance(d.get("model"), dict) else d.get("model"),
        "total": d["checkpoints"]["t0"]["total"],
        "weights": d["weights_bytes"],
        "formulas": [(x.get("id"), x.get("kv_blocks")) for x in d.get("formulas", [])],
        "graphs": {k: g.get(k) for k in ("graphs", "ops", "nodes", "pool_bytes", "exec_bytes",
                                          "exec_measured", "side_stream_bytes", "took_bytes",
                                          "kv_blocks", "failed")},
        "estimate": (g.get("estimate") or {}).get("total_bytes"),
        "samples": [(m["kind"], m["first_bytes"], m["second_bytes"])
                    for m in (g.get("estimate") or {}).get("modes", [])],
        "graph_events": pool_allocs,
    }))
