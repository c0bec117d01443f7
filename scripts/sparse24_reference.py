#!/usr/bin/env python3
"""Reference logits of a 2:4 sparse compressed-tensors checkpoint (as `vramscope gen-model
tiny DIR --sparse24 dense|bitmask [--sparse24-fp8]` writes it), for tests/sparse24.rs's
`sparse24_cpu_logits_match_the_reference`.

The format, decoded here independently of vramscope (docs/reading/vllm-sparse24.md):
  - dense: `NAME.weight [n, k]`, the pruned weight itself;
  - sparse-24-bitmask (compressed-tensors' Sparse24BitMaskCompressor):
    `NAME.bitmask [n, k/8]` U8, input 8j+b at bit b of byte j (numpy.packbits(...,
    bitorder="little")), `NAME.compressed [n, k/2]` the kept values in row-major order,
    `NAME.shape [2, 1]` I64 = [n, k];
  - fp8 (FP8_DYNAMIC): F8_E4M3 values, `NAME.weight_scale [n, 1]` F32, w = e4m3(code) * scale.
The dense weights run a Llama forward in float32 (PyTorch + transformers). The reference is
the format's values with float32 activations: vramscope's CPU path computes as vLLM's CUTLASS
sparse GEMM does (16-bit activations and output; fp8 activations per token for the fp8
scheme), and the test's bound allows for that.

Modes:
  python3 scripts/sparse24_reference.py DIR            PyTorch + transformers (LlamaForCausalLM,
                                                       float32, on the GPU when there is one)
  python3 scripts/sparse24_reference.py DIR --pure     the same math in plain Python (float64)
Both print the last-token logits at ids 3, 11, ..., 1019 of the dummy batch
(ids (i*7919+13) % vocab, one sequence of --tokens 16) as a Rust array.

Make DIR with:  cargo test --test sparse24 write_fixture -- --ignored   (VRAMSCOPE_SPARSE24_FIXTURE=DIR)
"""
import json, math, struct, sys

PICK = range(3, 1024, 8)
FP8 = False  # set by dense_weights: the checkpoint's activations are dynamic per-token fp8


def e4m3(b):
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0x0F, b & 0x07
    if e == 0x0F and m == 0x07:
        return float("nan")
    if e == 0:
        return s * m / 8.0 * 2.0 ** -6
    return s * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for k, m in hdr.items():
        if k == "__metadata__":
            continue
        a, b = m["data_offsets"]
        d, shape = m["dtype"], m["shape"]
        data = body[a:b]
        if d == "F16":
            vals = list(struct.unpack(f"<{len(data) // 2}e", data))
        elif d == "F32":
            vals = list(struct.unpack(f"<{len(data) // 4}f", data))
        elif d == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]
        elif d == "F8_E4M3":
            vals = [e4m3(x) for x in data]
        elif d == "U8":
            vals = list(data)
        elif d == "I64":
            vals = list(struct.unpack(f"<{len(data) // 8}q", data))
        else:
            raise SystemExit(f"{k}: dtype {d} not read here")
        out[k] = (d, shape, vals)
    return out


def e4m3_grid():
    """The finite non-negative float8_e4m3fn values with their codes, ascending."""
    return sorted((e4m3(c), c) for c in range(0x7F))


GRID = e4m3_grid()


def round_e4m3(v):
    """v (|v| <= 448) to the nearest e4m3 value, ties to the even code."""
    a = abs(v)
    lo, hi = 0, len(GRID) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if GRID[mid][0] <= a:
            lo = mid
        else:
            hi = mid
    (x0, c0), (x1, c1) = GRID[lo], GRID[hi]
    if a - x0 < x1 - a or (a - x0 == x1 - a and c0 % 2 == 0):
        r = x0
    else:
        r = x1
    return -r if v < 0 else r


def fake_fp8(x):
    """One token's activations as the fp8 GEMM sees them (quantized, then the scale)."""
    s = max(abs(v) for v in x) / 448.0
    if s == 0.0:
        return [0.0 for _ in x]
    inv = 1.0 / s
    return [round_e4m3(max(-448.0, min(448.0, v * inv))) * s for v in x]


def unpack_bitmask(mask, n, k):
    """numpy.unpackbits(mask, axis=-1, count=k, bitorder="little"), as a list of rows."""
    row_bytes = (k + 7) // 8
    return [[(mask[r * row_bytes + c // 8] >> (c % 8)) & 1 for c in range(k)] for r in range(n)]


def dense_weights(root):
    """Every weight as float rows: {name.weight: [[...], ...]}, 2:4 ones decoded."""
    global FP8
    cfg = json.load(open(f"{root}/config.json"))
    q = cfg["quantization_config"]
    FP8 = any(
        (g.get("input_activations") or {}).get("type") == "float"
        and g["input_activations"].get("strategy") == "token"
        and g["input_activations"].get("dynamic") is True
        for g in (q.get("config_groups") or {}).values()
    )
    sparse = q["sparsity_config"]
    assert sparse["sparsity_structure"] == "2:4", sparse
    t = read_safetensors(f"{root}/model.safetensors")
    W = {}
    for k, (d, shape, vals) in t.items():
        if not k.endswith(".weight"):
            continue
        if len(shape) == 1:
            W[k] = vals
        else:
            r, c = shape
            W[k] = [vals[i * c:(i + 1) * c] for i in range(r)]
    for k in list(t):
        if not k.endswith(".bitmask"):
            continue
        base = k[: -len(".bitmask")]
        n, kk = t[base + ".shape"][2]
        bits = unpack_bitmask(t[k][2], n, kk)
        values = iter(t[base + ".compressed"][2])
        rows = [[next(values) if b else 0.0 for b in row] for row in bits]
        assert next(values, None) is None, base
        W[base + ".weight"] = rows
    for k in list(t):
        if not k.endswith(".weight_scale"):
            continue
        base = k[: -len(".weight_scale")]
        scales = t[k][2]
        W[base + ".weight"] = [[v * s for v in row] for row, s in zip(W[base + ".weight"], scales)]
    for k, rows in W.items():
        if k.startswith("model.layers.") and k.endswith("_proj.weight"):
            for r, row in enumerate(rows):
                for g in range(0, len(row), 4):
                    assert sum(v != 0.0 for v in row[g:g + 4]) <= 2, (k, r, g)
    return cfg, W


def dummy_ids(tokens, vocab):
    return [(i * 7919 + 13) % vocab for i in range(tokens)]


def pure_forward(cfg, W, ids):
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)

    def norm(x, w):
        r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
        return [v * r * g for v, g in zip(x, w)]

    def mv(M, x):
        return [sum(a * b for a, b in zip(row, x)) for row in M]

    def lin(M, x):
        """A decoder linear: its input fp8-quantized per token under the fp8 scheme."""
        return mv(M, fake_fp8(x) if FP8 else x)

    def rope(v, pos):
        out = list(v)
        half = hd // 2
        for i in range(half):
            f = pos * theta ** (-2.0 * i / hd)
            c, s = math.cos(f), math.sin(f)
            a, b = v[i], v[i + half]
            out[i], out[i + half] = a * c - b * s, b * c + a * s
        return out

    xs = [list(W["model.embed_tokens.weight"][i]) for i in ids]
    T = len(ids)
    for l in range(L):
        p = f"model.layers.{l}."
        ks, vs, qs = [], [], []
        for t in range(T):
            h = norm(xs[t], W[p + "input_layernorm.weight"])
            q, k, v = lin(W[p + "self_attn.q_proj.weight"], h), lin(W[p + "self_attn.k_proj.weight"], h), lin(W[p + "self_attn.v_proj.weight"], h)
            qs.append([rope(q[i * hd:(i + 1) * hd], t) for i in range(nh)])
            ks.append([rope(k[i * hd:(i + 1) * hd], t) for i in range(nkv)])
            vs.append([v[i * hd:(i + 1) * hd] for i in range(nkv)])
        for t in range(T):
            att = []
            for i in range(nh):
                j = i // (nh // nkv)
                sc = [sum(a * b for a, b in zip(qs[t][i], ks[u][j])) / math.sqrt(hd) for u in range(t + 1)]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                att.extend(sum(e[u] / z * vs[u][j][d] for u in range(t + 1)) for d in range(hd))
            o = lin(W[p + "self_attn.o_proj.weight"], att)
            xs[t] = [a + b for a, b in zip(xs[t], o)]
        for t in range(T):
            h = norm(xs[t], W[p + "post_attention_layernorm.weight"])
            g, u = lin(W[p + "mlp.gate_proj.weight"], h), lin(W[p + "mlp.up_proj.weight"], h)
            a = [gg / (1.0 + math.exp(-gg)) * uu for gg, uu in zip(g, u)]
            d = lin(W[p + "mlp.down_proj.weight"], a)
            xs[t] = [a + b for a, b in zip(xs[t], d)]
    h = norm(xs[-1], W["model.norm.weight"])
    return mv(W["lm_head.weight"], h)


def torch_forward(cfg, W, ids):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    c = dict(cfg)
    c.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig(**c)).float()
    sd = {k: torch.tensor(v, dtype=torch.float32) for k, v in W.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    if FP8:
        def fake_fp8_hook(_module, args):
            x = args[0]
            s = x.abs().amax(-1, keepdim=True) / 448.0
            q = (x * torch.where(s > 0, 1.0 / s, torch.zeros_like(s))).clamp(-448.0, 448.0)
            return (q.to(torch.float8_e4m3fn).to(x.dtype) * s,)

        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."):
                m.register_forward_pre_hook(fake_fp8_hook)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(dev).eval()
    with torch.inference_mode():
        x = torch.tensor([ids], device=dev)
        logits = model(input_ids=x, use_cache=False).logits[0, -1].double().cpu().tolist()
    print(f"// torch {torch.__version__} on {dev}, float32", file=sys.stderr)
    return logits


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    root = args[0]
    tokens = int(args[args.index("--tokens") + 1]) if "--tokens" in args else 16
    cfg, W = dense_weights(root)
    ids = dummy_ids(tokens, cfg["vocab_size"])
    logits = pure_forward(cfg, W, ids) if "--pure" in args else torch_forward(cfg, W, ids)
    vals = [logits[i] for i in PICK]
    print("const REFERENCE: [f64; %d] = [" % len(vals))
    for i in range(0, len(vals), 6):
        print("    " + " ".join("%.9e," % v for v in vals[i:i + 6]))
    print("];")


if __name__ == "__main__":
    main()
