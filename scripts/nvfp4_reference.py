#!/usr/bin/env python3
"""Reference logits of an NVFP4 checkpoint (compressed-tensors `nvfp4-pack-quantized` or
ModelOpt `NVFP4`, as `vramscope gen-model tiny DIR --nvfp4 ct|modelopt` writes it), for
tests/nvfp4.rs's `nvfp4_cpu_logits_match_the_reference`.

The format's math, as vLLM 0.19 applies it (docs/reading/vllm-nvfp4-modelopt.md):
  - codes: two e2m1 values a byte along the input, element 2j in byte j's low nibble
    (compressed-tensors' `pack_fp4_to_uint8`; ModelOpt's export the same);
  - block scales: float8_e4m3fn, one per 16 inputs;
  - the global multiplier g: 1 / max(weight_global_scale) over a stacked layer's shards
    (compressed-tensors stores divisors, compressed_tensors_w4a4_nvfp4.py L97-100), or
    max(weight_scale_2) (ModelOpt, modelopt.py L1158-1159); q/k/v and gate/up are stacked;
  - w = e2m1(code) * e4m3(scale) * g.
The weights so dequantized run a Llama forward in float32 (the reference is the format's
values, not a kernel: vramscope's CPU path computes with 16-bit activations, as Marlin's
w4a16 fallback does, and the test allows for that).

Modes:
  python3 scripts/nvfp4_reference.py DIR            PyTorch + transformers (LlamaForCausalLM,
                                                   float32, on the GPU when there is one)
  python3 scripts/nvfp4_reference.py DIR --pure     the same math in plain Python (float64)
Both print the last-token logits at ids 3, 11, ..., 1019 of the dummy batch
(ids (i*7919+13) % vocab, one sequence of --tokens 16) as a Rust array.

Make DIR with:  cargo test --test nvfp4 write_fixture -- --ignored   (VRAMSCOPE_NVFP4_FIXTURE=DIR)
"""
import json, math, os, struct, sys

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
STACKS = [["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"]]
PICK = range(3, 1024, 8)


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
        elif d in ("U8", "F8_E4M3"):
            vals = list(data)
        else:
            raise SystemExit(f"{k}: dtype {d} not read here")
        out[k] = (d, shape, vals)
    return out


def flavor_of(root, cfg):
    q = cfg.get("quantization_config")
    if q is None and os.path.exists(f"{root}/hf_quant_config.json"):
        q = json.load(open(f"{root}/hf_quant_config.json"))
        q.setdefault("quant_method", "modelopt")
    if q and q.get("quant_method") == "compressed-tensors":
        return ["weight_packed", "weight_scale", "weight_global_scale"], True
    if q and q.get("quant_method") == "modelopt":
        return ["weight", "weight_scale", "weight_scale_2"], False
    raise SystemExit("not an NVFP4 checkpoint")


def dequantized(root):
    """Every weight as float rows: {name.weight: [[...], ...]} (16-bit ones as stored)."""
    cfg = json.load(open(f"{root}/config.json"))
    t = read_safetensors(f"{root}/model.safetensors")
    (codes_n, scale_n, global_n), divisor = flavor_of(root, cfg)
    weights = {}
    for k, (d, shape, vals) in t.items():
        if d in ("F16", "BF16", "F32") and k.endswith(".weight") and (
            not k.endswith("_proj.weight") or codes_n != "weight"
        ):
            if len(shape) == 1:
                weights[k] = vals
            else:
                r, c = shape
                weights[k] = [vals[i * c:(i + 1) * c] for i in range(r)]
    for k in t:
        if not k.endswith("_proj." + codes_n) or not k.startswith("model.layers."):
            continue
        base = k[: -len(codes_n) - 1]
        proj = base.rsplit(".", 1)[1]
        stack = next((s for s in STACKS if proj in s), [proj])
        stored = [t[base.rsplit(".", 1)[0] + "." + p + "." + global_n][2][0] for p in stack]
        g = 1.0 / max(stored) if divisor else max(stored)
        if divisor:
            g = struct.unpack("<f", struct.pack("<f", g))[0]  # f32, as vLLM computes it
        _, (n, half), codes = t[k]
        kk = half * 2
        scales = t[f"{base}.{scale_n}"][2]
        rows = []
        for r in range(n):
            row = []
            for c in range(kk):
                j = r * kk + c
                code = (codes[j // 2] >> (4 * (j % 2))) & 0x0F
                row.append(E2M1[code] * e4m3(scales[j // 16]) * g)
            rows.append(row)
        weights[base + ".weight"] = rows
    return cfg, weights


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
            q, k, v = mv(W[p + "self_attn.q_proj.weight"], h), mv(W[p + "self_attn.k_proj.weight"], h), mv(W[p + "self_attn.v_proj.weight"], h)
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
            o = mv(W[p + "self_attn.o_proj.weight"], att)
            xs[t] = [a + b for a, b in zip(xs[t], o)]
        for t in range(T):
            h = norm(xs[t], W[p + "post_attention_layernorm.weight"])
            g, u = mv(W[p + "mlp.gate_proj.weight"], h), mv(W[p + "mlp.up_proj.weight"], h)
            a = [gg / (1.0 + math.exp(-gg)) * uu for gg, uu in zip(g, u)]
            d = mv(W[p + "mlp.down_proj.weight"], a)
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
    cfg, W = dequantized(root)
    ids = dummy_ids(tokens, cfg["vocab_size"])
    logits = pure_forward(cfg, W, ids) if "--pure" in args else torch_forward(cfg, W, ids)
    vals = [logits[i] for i in PICK]
    print("const REFERENCE: [f64; %d] = [" % len(vals))
    for i in range(0, len(vals), 6):
        print("    " + " ".join("%.9e," % v for v in vals[i:i + 6]))
    print("];")


if __name__ == "__main__":
    main()
