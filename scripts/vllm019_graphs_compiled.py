# vLLM 0.19's CUDA graph estimator and capture, replayed with PyTorch for Llama-3.1-8B (bf16,
# seeded weights), with the pieces compiled by Inductor ("inductor") or left as eager torch ops
# ("eager"). Used by docs/gpu-runs.md run 96 to ask whether torch.compile's pieces explain the
# graph memory of the public log Q1 (0.84 GiB estimated, 0.91 GiB took, H100).
#
# What it follows (docs/reading/vllm-v1-graphs.md):
# - the split: 33 pieces per forward, cut at every attention (the attention output buffer is
#   allocated at the end of the piece before it); in PIECEWISE runs attention has no metadata
#   and only zeroes its output (flash_attn.py:666-668);
# - FULL graphs hold the whole forward with FlashAttention 3 at 32 splits: per attention call
#   softmax_lse [H, n], out_accum [32, H, n, d] and softmax_lse_accum [32, H, n], all fp32
#   (flash_api.cpp:968, 1182-1191); the kernels are stand-ins that write those buffers;
# - sizes 512..1 (51), largest first, one eager warm-up per size on the capture stream, the
#   gather hidden[logit_indices] after each run, one graph pool for every size;
# - the estimator: a throwaway pool, the two largest sizes per mode, each sampled by free
#   memory, max(first) + sum((n - 1) * max(second, 1 MiB)) (gpu_model_runner.py:5862-5960);
# - the capture: empty_cache, free memory, every size of both modes, free memory again before
#   the last empty_cache (gpu_model_runner.py:6006-6051).
import ctypes, gc, json, os, sys, time
import torch
import torch._dynamo
import torch.nn.functional as F

MODE = sys.argv[1]            # eager | inductor
OUT = sys.argv[2]
H, I, NH, NKV, HD, L, V = 4096, 14336, 32, 8, 128, 32, 128256
EPS = 1e-5
SPLITS = 32
dt = torch.bfloat16
dev = torch.device("cuda")
MIB = 1 << 20
torch.manual_seed(0)
for k in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
          "accumulated_recompile_limit"):
    if hasattr(torch._dynamo.config, k):
        setattr(torch._dynamo.config, k, 256)
SIZES = sorted(set([1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))), reverse=True)
assert len(SIZES) == 51, len(SIZES)


def w(*s):
    return torch.randn(*s, device=dev, dtype=dt) * 0.02


emb = w(V, H)
layers = [dict(qkv=w((NH + 2 * NKV) * HD, H), o=w(H, NH * HD), gu=w(2 * I, H), down=w(H, I),
               ln1=torch.ones(H, device=dev, dtype=dt), ln2=torch.ones(H, device=dev, dtype=dt))
          for _ in range(L)]
final_ln = torch.ones(H, device=dev, dtype=dt)
inv = 1.0 / (500000.0 ** (torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD))
fr = torch.outer(torch.arange(8192, device=dev, dtype=torch.float32), inv)
cos_sin = torch.cat([fr.cos(), fr.sin()], dim=-1).to(dt)
# Persistent runner buffers (input_ids, positions) and a KV cache of 512 blocks of 16.
input_ids = torch.zeros(8192, dtype=torch.long, device=dev)
positions = torch.zeros(8192, dtype=torch.long, device=dev)
kv = torch.zeros(L, 2, 512 * 16, NKV, HD, device=dev, dtype=dt)


def rms(x, wt):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(dt) * wt


def rope(pos, q, k):
    cos, sin = cos_sin.index_select(0, pos).chunk(2, dim=-1)

    def rot(x, nh):
        x = x.view(x.shape[0], nh, HD)
        x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(1)
    return rot(q, NH), rot(k, NKV)


def qkv_rope(h, pos, lw):
    q, k, v = F.linear(h, lw["qkv"]).split([NH * HD, NKV * HD, NKV * HD], dim=-1)
    q, k = rope(pos, q, k)
    out = torch.empty(h.shape[0], NH * HD, device=dev, dtype=dt)
    return q, k, v, out


def mlp(h, lw):
    gu = F.linear(h, lw["gu"])
    return F.linear(F.silu(gu[..., :I]) * gu[..., I:], lw["down"])


def first(ids, pos, l0):
    x = F.embedding(ids, emb)
    q, k, v, out = qkv_rope(rms(x, l0["ln1"]), pos, l0)
    return q, k, v, out, x


def mid(attn, res, pos, prev, nxt):
    x = F.linear(attn, prev["o"]) + res
    x = mlp(rms(x, prev["ln2"]), prev) + x
    q, k, v, out = qkv_rope(rms(x, nxt["ln1"]), pos, nxt)
    return q, k, v, out, x


def last(attn, res, prev):
    x = F.linear(attn, prev["o"]) + res
    x = mlp(rms(x, prev["ln2"]), prev) + x
    return rms(x, final_ln)


if MODE == "inductor":
    first_f = torch.compile(first, dynamic=True, fullgraph=True)
    mid_f = torch.compile(mid, dynamic=True, fullgraph=True)
    last_f = torch.compile(last, dynamic=True, fullgraph=True)
else:
    first_f, mid_f, last_f = first, mid, last


def attention(layer, q, k, v, out, full):
    """The splitting ops: kv cache update, then attention into `out`."""
    n = q.shape[0]
    if not full:
        out.fill_(0)                 # no metadata: FA zeroes its output
        return
    kv[layer, 0, :n].copy_(k.view(n, NKV, HD))
    kv[layer, 1, :n].copy_(v.reshape(n, NKV, HD))
    lse = torch.empty(NH, n, device=dev, dtype=torch.float32)
    oacc = torch.empty(SPLITS, NH, n, HD, device=dev, dtype=torch.float32)
    lacc = torch.empty(SPLITS, NH, n, device=dev, dtype=torch.float32)
    oacc[0].copy_(q.view(n, NH, HD).transpose(0, 1))      # the split kernel's writes
    lacc[0].fill_(0)
    lse.fill_(0)
    out.view(n, NH, HD).copy_(oacc[0].transpose(0, 1))    # the combine kernel
    del lse, oacc, lacc


class Capture:
    """Graphs of one run: PIECEWISE captures each piece, FULL the whole forward."""

    def __init__(self, pool, stream):
        self.pool, self.stream, self.graphs = pool, stream, []

    def piece(self, fn, *a):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            o = fn(*a)
        self.graphs.append(g)
        return o


def forward(n, full, cap=None):
    ids, pos = input_ids[:n], positions[:n]
    run = (lambda fn, *a: cap.piece(fn, *a)) if cap is not None else (lambda fn, *a: fn(*a))
    q, k, v, out, x = run(first_f, ids, pos, layers[0])
    for i in range(1, L):
        attention(i - 1, q, k, v, out, full)
        q, k, v, out, x = run(mid_f, out, x, pos, layers[i - 1], layers[i])
    attention(L - 1, q, k, v, out, full)
    return run(last_f, out, x, layers[L - 1])


def gather(h, n):
    idx = torch.arange(n, device="cpu").to(dev)       # logit_indices, copied from the host
    return h[idx]


def warmup_and_capture(n, full, pool, stream, graphs):
    with torch.cuda.stream(stream):
        h = forward(n, full)                           # eager warm-up on the capture stream
        gather(h, n)
        del h
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        if full:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=stream):
                h = forward(n, True)
            graphs.append(g)
        else:
            cap = Capture(pool, stream)
            h = forward(n, False, cap)
            graphs += cap.graphs
        gather(h, n)
        del h
    torch.cuda.synchronize()


def free():
    return torch.cuda.mem_get_info()[0]


res = {"mode": MODE, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
t0 = time.time()
for n in (8192, 512, 1, 37, 2):                       # the profile run's size, then graphs'
    for full in (False, True):
        if n <= 512 or not full:
            forward(n, full)
torch.cuda.synchronize()
res["compile_s"] = round(time.time() - t0, 2)
torch.cuda.empty_cache()

# The estimator.
stream = torch.cuda.Stream()
pool = torch.cuda.graph_pool_handle()
graphs = []
torch.cuda.synchronize()
torch.cuda.empty_cache()
samples = {}
for kind, full in (("PIECEWISE", False), ("FULL", True)):
    s = []
    for n in SIZES[:2]:
        before = free()
        warmup_and_capture(n, full, pool, stream, graphs)
        s.append(before - free())
    samples[kind] = s
first_capture = max(s[0] for s in samples.values())
rest = sum(max(s[1], MIB) * (len(SIZES) - 1) for s in samples.values())
res["estimate"] = dict(samples_mib={k: [x / MIB for x in v] for k, v in samples.items()},
                       total_mib=(first_capture + rest) / MIB)
del graphs, pool, stream
gc.collect()
torch.cuda.empty_cache()

# The capture, as after the KV cache.
torch.cuda.synchronize()
torch.cuda.empty_cache()
start, rsv0 = free(), torch.cuda.memory_reserved()
stream = torch.cuda.Stream()
pool = torch.cuda.graph_pool_handle()
graphs = []
t0 = time.time()
per_mode = {}
for kind, full in (("PIECEWISE", False), ("FULL", True)):
    b = free()
    for n in SIZES:
        warmup_and_capture(n, full, pool, stream, graphs)
    per_mode[kind] = (b - free()) / MIB
torch.cuda.synchronize()
end, rsv1 = free(), torch.cuda.memory_reserved()
res["capture"] = dict(graphs=len(graphs), took_mib=(start - end) / MIB,
                      reserved_growth_mib=(rsv1 - rsv0) / MIB,
                      driver_mib=((start - end) - (rsv1 - rsv0)) / MIB,
                      per_mode_mib=per_mode, seconds=round(time.time() - t0, 2))

# Nodes of the graphs at 512 and at 1 (kept graphs, counted through the driver).
try:
    cu = ctypes.CDLL("libcuda.so.1")

    def nodes(g):
        c = ctypes.c_size_t(0)
        r = cu.cuGraphGetNodes(ctypes.c_void_p(g.raw_cuda_graph()), None, ctypes.byref(c))
        return int(c.value) if r == 0 else -r
    counts = {}
    for n in (512, 1):
        kept = []

        def keep(fn, *a):
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(g, stream=stream):
                o = fn(*a)
            kept.append(g)
            return o
        with torch.cuda.stream(stream):
            ids, pos = input_ids[:n], positions[:n]
            q, k, v, out, x = keep(first_f, ids, pos, layers[0])
            q, k, v, out, x = keep(mid_f, out, x, pos, layers[0], layers[1])
            keep(last_f, out, x, layers[L - 1])
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(g, stream=stream):
                forward(n, True)
            kept.append(g)
        counts[str(n)] = [nodes(g) for g in kept]
    res["nodes_first_mid_last_full"] = counts
except Exception as e:  # noqa: BLE001
    res["nodes_error"] = repr(e)[:300]
print(json.dumps(res))
with open(os.path.join(OUT, f"vllm019_graphs_{MODE}.json"), "w") as f:
    json.dump(res, f, indent=1)
