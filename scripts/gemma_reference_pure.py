#!/usr/bin/env python3
"""An independent Gemma 2 / Gemma 3 (text) forward in pure Python (fp64, no torch, no numpy),
written from Hugging Face's modeling_gemma2.py / modeling_gemma3.py math, for checking the Rust
CPU path where transformers is not installed. It is not the reference: tests/hf_reference.rs
stores transformers' own logits (scripts/hf_reference.py).

Reads the fixtures `write_fixtures` writes (f16 safetensors, config.json as vramscope writes
it) and prints the last token's logits at ids 3, 19, ..., 1011 of the 6- and 5-token sequences
as a Rust array, in hf_reference.py's layout.

Run: python3 scripts/gemma_reference_pure.py DIR gemma2   (or gemma3)
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
eps = cfg["rms_norm_eps"]; scale = cfg["query_pre_attn_scalar"] ** -0.5
acap, fcap = cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping")
win = cfg["sliding_window"]; types = cfg["layer_types"]
g3 = cfg["model_type"] == "gemma3_text"
def norm(x, w):
    r = 1 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * (1 + wi) for v, wi in zip(x, w)]
def mv(W, x): return [sum(a * b for a, b in zip(row, x)) for row in W]
def gelu(x): return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
def rope(v, pos, theta, factor):
    half = hd // 2; out = list(v)
    for i in range(half):
        ang = (pos / factor) * theta ** (-2 * i / hd); c, s = math.cos(ang), math.sin(ang)
        out[i] = v[i] * c - v[i + half] * s; out[i + half] = v[i + half] * c + v[i] * s
    return out
E = T("model.embed_tokens.weight")
Ls = []
for l in range(L):
    p = f"model.layers.{l}."
    d = {k: T(p + k + ".weight") for k in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
         "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "pre_feedforward_layernorm",
         "post_feedforward_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]}
    if g3:
        d["q_norm"] = T(p + "self_attn.q_norm.weight"); d["k_norm"] = T(p + "self_attn.k_norm.weight")
    Ls.append(d)
FN = T("model.norm.weight")
TOKENS, SEQS, V = 11, 2, cfg["vocab_size"]
lens = [6, 5]; ids = [(i * 7919 + 13) % V for i in range(TOKENS)]
PICK = list(range(3, V, 16)); start = 0
print(f"const HF_{name.upper()}: [[f64; 64]; 2] = [")
for n_ in lens:
    toks = ids[start:start + n_]; start += n_
    res = [[v * math.sqrt(H) for v in E[t]] for t in toks]
    for l, d in enumerate(Ls):
        sliding = types[l] == "sliding_attention"
        if g3 and sliding: theta, factor = cfg["rope_local_base_freq"], 1.0
        elif g3: theta, factor = cfg["rope_theta"], (cfg["rope_scaling"] or {}).get("factor", 1.0)
        else: theta, factor = cfg["rope_theta"], 1.0
        x = [norm(r, d["input_layernorm"]) for r in res]
        Q = [mv(d["self_attn.q_proj"], r) for r in x]; K = [mv(d["self_attn.k_proj"], r) for r in x]
        Vv = [mv(d["self_attn.v_proj"], r) for r in x]
        heads = lambda row, h: row[h * hd:(h + 1) * hd]
        q = [[heads(Q[t], h) for h in range(nh)] for t in range(n_)]
        k = [[heads(K[t], h) for h in range(nkv)] for t in range(n_)]
        if g3:
            q = [[norm(v, d["q_norm"]) for v in row] for row in q]; k = [[norm(v, d["k_norm"]) for v in row] for row in k]
        q = [[rope(v, t, theta, factor) for v in q[t]] for t in range(n_)]
        k = [[rope(v, t, theta, factor) for v in k[t]] for t in range(n_)]
        att = []
        for t in range(n_):
            row = []
            for h in range(nh):
                kh = h // (nh // nkv); sc = []
                for j in range(t + 1):
                    s = sum(a * b for a, b in zip(q[t][h], k[j][kh])) * scale
                    if acap: s = math.tanh(s / acap) * acap
                    if sliding and t - j >= win: s = -math.inf
                    sc.append(s)
                m = max(sc); e = [math.exp(s - m) for s in sc]; z = sum(e)
                o = [sum(e[j] / z * Vv[j][kh * hd + c] for j in range(t + 1)) for c in range(hd)]
                row += o
            att.append(row)
        o = [norm(mv(d["self_attn.o_proj"], a), d["post_attention_layernorm"]) for a in att]
        res = [[a + b for a, b in zip(r, oo)] for r, oo in zip(res, o)]
        x = [norm(r, d["pre_feedforward_layernorm"]) for r in res]
        m = [mv(d["mlp.down_proj"], [gelu(g) * u for g, u in zip(mv(d["mlp.gate_proj"], r), mv(d["mlp.up_proj"], r))]) for r in x]
        m = [norm(r, d["post_feedforward_layernorm"]) for r in m]
        res = [[a + b for a, b in zip(r, mm)] for r, mm in zip(res, m)]
    h = norm(res[-1], FN)
    logits = [sum(a * b for a, b in zip(h, E[i])) for i in PICK]
    if fcap: logits = [math.tanh(v / fcap) * fcap for v in logits]
    print("    [" + ", ".join(f"{v:.8e}" for v in logits) + "],")
print("];")
