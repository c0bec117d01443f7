#!/usr/bin/env python3
"""An independent Llama / Qwen2 forward in pure Python (fp64, no torch, no numpy) with the rotary
frequencies of a config's `rope_scaling`, written from Hugging Face transformers' formulas
(modeling_rope_utils.py: `_compute_llama3_parameters`, `_compute_yarn_parameters`; RMSNorm,
SwiGLU MLP, q/k/v bias for qwen2, tied embeddings as the config says). It checks the Rust CPU
path where transformers is not installed; scripts/hf_reference.py (transformers itself, on the
GPU machine) prints the same arrays.

Reads the fixtures `write_fixtures` writes (f16 safetensors, config.json as vramscope writes it)
and prints the last token's logits at ids 3, 19, ..., 1011 of the 6- and 5-token sequences as a
Rust array, in hf_reference.py's layout.

Run: python3 scripts/rope_scaling_reference_pure.py DIR llama_llama3   (or qwen2_yarn)
"""
import json, math, struct, sys
root, name = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{root}/{name}/config.json"))
raw = open(f"{root}/{name}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); body = raw[8 + n:]
def T(k):
    m = hdr[k]; a, b = m["data_offsets"]; assert m["dtype"] == "F16"
    vals = struct.unpack(f"<{(b - a) // 2}e", body[a:b]); shape = m["shape"]
    if len(shape) == 1: return list(vals)
    r, c = shape; return [list(vals[i * c:(i + 1) * c]) for i in range(r)]
H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
eps, base = cfg["rms_norm_eps"], cfg["rope_theta"]
rs = cfg.get("rope_scaling") or {}
kind = rs.get("rope_type", rs.get("type", "default"))

def inv_freq_and_attention_factor():
    plain = [1.0 / base ** (i / hd) for i in range(0, hd, 2)]
    if kind == "llama3":
        f, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        lo_wave, hi_wave = old / lo, old / hi
        out = []
        for x in plain:
            wave = 2 * math.pi / x
            y = x / f if wave > lo_wave else x
            if not wave < hi_wave and not wave > lo_wave:
                smooth = (old / wave - lo) / (hi - lo)
                y = (1 - smooth) * y / f + smooth * y
            out.append(y)
        return out, 1.0
    if kind == "yarn":
        f = rs["factor"]
        old = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        att = rs.get("attention_factor")
        if att is None: att = 0.1 * math.log(f) + 1.0 if f > 1 else 1.0
        dim_of = lambda rot: (hd * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))
        low, high = math.floor(dim_of(fast)), math.ceil(dim_of(slow))
        low, high = max(low, 0), min(high, hd - 1)
        if low == high: high += 0.001
        out = []
        for i, x in enumerate(plain):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            extra = 1 - ramp
            out.append(x / f * (1 - extra) + x * extra)
        return out, att
    assert kind == "default", kind
    return plain, 1.0

INV, ATT = inv_freq_and_attention_factor()
def norm(x, w):
    r = 1 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * wi for v, wi in zip(x, w)]
def mv(W, x, b=None):
    y = [sum(a * c for a, c in zip(row, x)) for row in W]
    return [u + v for u, v in zip(y, b)] if b else y
def rope(v, pos):
    half = hd // 2; out = list(v)
    for i in range(half):
        ang = pos * INV[i]; c, s = math.cos(ang) * ATT, math.sin(ang) * ATT
        out[i] = v[i] * c - v[i + half] * s; out[i + half] = v[i + half] * c + v[i] * s
    return out
bias = cfg["model_type"] == "qwen2"
E = T("model.embed_tokens.weight")
LM = E if cfg.get("tie_word_embeddings") else T("lm_head.weight")
Ls = []
for l in range(L):
    p = f"model.layers.{l}."
    d = {k: T(p + k + ".weight") for k in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
         "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj"]}
    for k in ["q", "k", "v"]:
        d[k + "_bias"] = T(p + f"self_attn.{k}_proj.bias") if bias else None
    Ls.append(d)
FN = T("model.norm.weight")
TOKENS, V = 11, cfg["vocab_size"]
lens = [6, 5]; ids = [(i * 7919 + 13) % V for i in range(TOKENS)]
PICK = list(range(3, V, 16)); start = 0
print(f"// {name}: rope_scaling {kind}, inv_freq[0] {INV[0]:.6e}, inv_freq[-1] {INV[-1]:.6e}, cos/sin x {ATT:.6f}")
print(f"const PURE_{name.upper()}: [[f64; 64]; 2] = [")
for n_ in lens:
    toks = ids[start:start + n_]; start += n_
    res = [list(E[t]) for t in toks]
    for d in Ls:
        x = [norm(r, d["input_layernorm"]) for r in res]
        Q = [mv(d["self_attn.q_proj"], r, d["q_bias"]) for r in x]
        K = [mv(d["self_attn.k_proj"], r, d["k_bias"]) for r in x]
        Vv = [mv(d["self_attn.v_proj"], r, d["v_bias"]) for r in x]
        heads = lambda row, h: row[h * hd:(h + 1) * hd]
        q = [[rope(heads(Q[t], h), t) for h in range(nh)] for t in range(n_)]
        k = [[rope(heads(K[t], h), t) for h in range(nkv)] for t in range(n_)]
        att = []
        for t in range(n_):
            row = []
            for h in range(nh):
                kh = h // (nh // nkv)
                sc = [sum(a * b for a, b in zip(q[t][h], k[j][kh])) / math.sqrt(hd) for j in range(t + 1)]
                m = max(sc); e = [math.exp(s - m) for s in sc]; z = sum(e)
                row += [sum(e[j] / z * Vv[j][kh * hd + c] for j in range(t + 1)) for c in range(hd)]
            att.append(row)
        res = [[a + b for a, b in zip(r, mv(d["self_attn.o_proj"], o))] for r, o in zip(res, att)]
        x = [norm(r, d["post_attention_layernorm"]) for r in res]
        silu = lambda g: g / (1 + math.exp(-g))
        m = [mv(d["mlp.down_proj"], [silu(g) * u for g, u in zip(mv(d["mlp.gate_proj"], r), mv(d["mlp.up_proj"], r))]) for r in x]
        res = [[a + b for a, b in zip(r, mm)] for r, mm in zip(res, m)]
    h = norm(res[-1], FN)
    logits = [sum(a * b for a, b in zip(h, LM[i])) for i in PICK]
    print("    [" + ", ".join(f"{v:.8e}" for v in logits) + "],")
print("];")
