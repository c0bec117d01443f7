# Run 56 (docs/gpu-runs.md): driver memory and pool of CUDA graphs of vLLM-style PIECEWISE pieces of a
# Llama-3-8B, eager torch ops against the same pieces compiled by Inductor (dynamic batch),
# captured largest size first into one private pool, as vLLM 0.19 captures its 51 sizes.
import json, os, sys, time, ctypes
import torch
import torch._dynamo
import torch.nn.functional as F

MODE = sys.argv[1]            # eager | inductor
OUT = sys.argv[2]
H, I, NH, NKV, HD, L, V = 4096, 14336, 32, 8, 128, 32, 128256
EPS = 1e-5
dt = torch.float16
dev = torch.device("cuda")
torch.manual_seed(0)
for k in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
    if hasattr(torch._dynamo.config, k):
        setattr(torch._dynamo.config, k, 256)
# 0.19's sizes: 1,2,4, 8..256 step 8, 272..512 step 16 (51 sizes)
SIZES = sorted(set([1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))), reverse=True)
assert len(SIZES) == 51, len(SIZES)

def w(*s):
    return torch.randn(*s, device=dev, dtype=dt) * 0.02

emb = w(V, H)
layers = [dict(qkv=w((NH + 2 * NKV) * HD, H), o=w(H, NH * HD), gu=w(2 * I, H), down=w(H, I),
               ln1=torch.ones(H, device=dev, dtype=dt), ln2=torch.ones(H, device=dev, dtype=dt))
          for _ in range(L)]
final_ln = torch.ones(H, device=dev, dtype=dt)
inv = 1.0 / (500000.0 ** (torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD))
t = torch.arange(8192, device=dev, dtype=torch.float32)
fr = torch.outer(t, inv)
cos_sin = torch.cat([fr.cos(), fr.sin()], dim=-1).to(dt)   # [8192, HD]

def rms(x, wt):
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + EPS)).to(dt) * wt

def rope(pos, q, k):
    cs = cos_sin.index_select(0, pos)
    cos, sin = cs.chunk(2, dim=-1)
    def rot(x, nh):
        x = x.view(x.shape[0], nh, HD)
        x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(1)
    return rot(q, NH), rot(k, NKV)

def qkv_rope(h, pos, lw):
    qkv = F.linear(h, lw["qkv"])
    q, k, v = qkv.split([NH * HD, NKV * HD, NKV * HD], dim=-1)
    q, k = rope(pos, q, k)
    return q, k, v.contiguous()

def mlp(h, lw):
    gu = F.linear(h, lw["gu"])
    return F.linear(F.silu(gu[..., :I]) * gu[..., I:], lw["down"])

def first(ids, pos, l0):
    x = F.embedding(ids, emb)
    h = rms(x, l0["ln1"])
    q, k, v = qkv_rope(h, pos, l0)
    return q, k, v, x

def mid(attn, res, pos, prev, nxt):
    x = F.linear(attn, prev["o"]) + res
    h = rms(x, prev["ln2"])
    x = mlp(h, prev) + x
    h = rms(x, nxt["ln1"])
    q, k, v = qkv_rope(h, pos, nxt)
    return q, k, v, x

def last(attn, res, prev):
    x = F.linear(attn, prev["o"]) + res
    h = rms(x, prev["ln2"])
    x = mlp(h, prev) + x
    return rms(x, final_ln)

if MODE == "inductor":
    first_f = torch.compile(first, dynamic=True, fullgraph=True)
    mid_f = torch.compile(mid, dynamic=True, fullgraph=True)
    last_f = torch.compile(last, dynamic=True, fullgraph=True)
else:
    first_f, mid_f, last_f = first, mid, last

def forward(n, capture=None, pool=None, stream=None, graphs=None):
    ids = torch.zeros(n, dtype=torch.long, device=dev)
    pos = torch.arange(n, device=dev)
    def run(fn, *a):
        if capture:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=stream):
                o = fn(*a)
            graphs.append(g)
            return o
        return fn(*a)
    q, k, v, x = run(first_f, ids, pos, layers[0])
    for i in range(1, L):
        q, k, v, x = run(mid_f, q, x, pos, layers[i - 1], layers[i])
    return run(last_f, q, x, layers[L - 1])

res = {"mode": MODE, "torch": torch.__version__, "sizes": len(SIZES)}
t0 = time.time()
for n in (SIZES[0], SIZES[-1], 2, 37):      # compile / warm all shape classes
    forward(n)
torch.cuda.synchronize()
res["warm_s"] = round(time.time() - t0, 2)
# eager reference for the replay check
ref = forward(SIZES[0]).float().clone()

stream = torch.cuda.Stream()
torch.cuda.synchronize(); torch.cuda.empty_cache()
free0 = torch.cuda.mem_get_info()[0]
rsv0 = torch.cuda.memory_reserved()
pool = torch.cuda.graph_pool_handle()
graphs, outs, samples = [], [], []
t0 = time.time()
for j, n in enumerate(SIZES):
    fb = torch.cuda.mem_get_info()[0]; rb = torch.cuda.memory_reserved()
    with torch.cuda.stream(stream):
        forward(n)                        # warm-up, as vLLM's per-size warm-up
    stream.synchronize()
    gs = []
    o = forward(n, capture=True, pool=pool, stream=stream, graphs=gs)
    torch.cuda.synchronize()
    graphs += gs
    outs.append(o if j == 0 else None)
    if j < 3:
        samples.append(dict(size=n, free_drop=fb - torch.cuda.mem_get_info()[0],
                            reserved_growth=torch.cuda.memory_reserved() - rb, graphs=len(gs)))
torch.cuda.synchronize()
res["capture_s"] = round(time.time() - t0, 2)
free1 = torch.cuda.mem_get_info()[0]
rsv1 = torch.cuda.memory_reserved()
res.update(graphs=len(graphs), took=free0 - free1, reserved_growth=rsv1 - rsv0,
           driver=(free0 - free1) - (rsv1 - rsv0), samples=samples)
res["driver_per_graph"] = res["driver"] / len(graphs)
# first replay uploads: measure again after replaying every graph once
for g in graphs:
    g.replay()
torch.cuda.synchronize()
free2 = torch.cuda.mem_get_info()[0]
res["after_replay_extra"] = free1 - free2
# The sizes share the pool, so the largest size's output is checked after replaying its own
# 33 graphs again (run 56 compared it after replaying every size, which overwrote it).
for g in graphs[:33]:
    g.replay()
torch.cuda.synchronize()
res["replay_rel_l2"] = float((outs[0].float() - ref).norm() / ref.norm())
# node counts of one graph of each piece kind (kept graph, driver API)
try:
    cu = ctypes.CDLL("libcuda.so.1")
    counts = {}
    for name, n in (("first/mid/last@512", 512), ("@1", 1)):
        kept = []
        def capk(fn, *a):
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(g, stream=stream):
                o = fn(*a)
            kept.append(g)
            return o
        pos = torch.arange(n, device=dev)
        q, k, v, x = capk(first_f, torch.zeros(n, dtype=torch.long, device=dev), pos, layers[0])
        q2, k2, v2, x2 = capk(mid_f, q, x, pos, layers[0], layers[1])
        capk(last_f, q2, x2, layers[L - 1])
        c = []
        for g in kept:
            cnt = ctypes.c_size_t(0)
            r = cu.cuGraphGetNodes(ctypes.c_void_p(g.raw_cuda_graph()), None, ctypes.byref(cnt))
            c.append(int(cnt.value) if r == 0 else f"err{r}")
        counts[name] = c
    res["nodes_first_mid_last"] = counts
except Exception as e:  # noqa
    res["nodes_error"] = repr(e)[:300]
print(json.dumps(res))
with open(os.path.join(OUT, f"inductor_{MODE}.json"), "w") as f:
    json.dump(res, f, indent=1)
