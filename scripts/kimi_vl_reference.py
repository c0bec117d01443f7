#!/usr/bin/env python3
"""Reference image embeddings for tests/kimi_vl_reference.rs: Kimi-VL's MoonViT tower and
projector in fp32 on the CPU, on the small seeded `kimi_vl` checkpoint the test writes with
gen-model.

transformers has no Kimi-VL (its modeling code is the checkpoint's remote code), so this is
vLLM 0.19.0's algorithm (model_executor/models/moonvit.py and kimi_vl.py) rendered in plain
PyTorch ops written here, independent of vramscope's Rust: the patch embedding as F.conv2d,
the position grid resized by F.interpolate(mode="bicubic"), the 2D rotary with torch.polar and
complex products, attention per image with F.scaled_dot_product_attention, F.layer_norm,
F.gelu(approximate="tanh") in the blocks, the 2 x 2 merge by view/permute, the projector's
LayerNorm, linear_1, exact GELU and linear_2.

Fixture:  VRAMSCOPE_KIMI_VL_FIXTURE=DIR cargo test --test kimi_vl_reference -- --ignored write_fixture
Run:      python3 scripts/kimi_vl_reference.py DIR > tests/fixtures/kimi_vl/reference.rs
                                        (torch, fp32 CPU)
          python3 scripts/kimi_vl_reference.py DIR --pure > ...
                                        (the same math in plain Python, without torch)

The pixels are the test's: `pixel_values [sum h*w, 3*p*p]` whose flat element i holds
sin(0.013 * i), for the grids (h, w) of GRIDS. Prints the embeddings [sum h*w / 4, text
hidden] as a Rust array.
"""
import json
import math
import os
import sys

import vision_reference_common as common

root = sys.argv[1]
pure = "--pure" in sys.argv
GRIDS = [(6, 8), (4, 6), (2, 10)]
cfg = json.load(open(os.path.join(root, "config.json")))
vc = cfg["vision_config"]
D, I, LAYERS, H = (vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"],
                   vc["num_attention_heads"])
P = vc["patch_size"]
H0, W0 = vc["init_pos_emb_height"], vc["init_pos_emb_width"]
KH, KW = vc.get("merge_kernel_size", [2, 2])
HD = D // H
EPS = 1e-5
THETA = 10000.0
K = 3 * P * P
ROWS = sum(h * w for h, w in GRIDS)
PIXELS = [math.sin(0.013 * i) for i in range(ROWS * K)]
TOWER, PROJ = "vision_tower", "multi_modal_projector"


def emit(values, how):
    common.emit(values, how, len(GRIDS))


if not pure:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file

    w = {}
    for fn in sorted(os.listdir(root)):
        if fn.endswith(".safetensors"):
            w.update({k: v.float() for k, v in load_file(os.path.join(root, fn)).items()})

    def rope_angles(h, wd):
        # Rope2DPosEmb: pair 2i turns by the column, pair 2i + 1 by the row, theta^(-4i/HD).
        freqs = 1.0 / THETA ** (torch.arange(0, HD, 4)[: HD // 4].float() / HD)
        ys, xs = torch.meshgrid(torch.arange(h).float(), torch.arange(wd).float(), indexing="ij")
        xa = torch.outer(xs.reshape(-1), freqs)
        ya = torch.outer(ys.reshape(-1), freqs)
        return torch.stack([xa, ya], dim=-1).reshape(h * wd, HD // 2)

    with torch.no_grad():
        px = torch.tensor(PIXELS, dtype=torch.float32).reshape(ROWS, 3, P, P)
        x = F.conv2d(px, w[f"{TOWER}.patch_embed.proj.weight"],
                     w[f"{TOWER}.patch_embed.proj.bias"], stride=P).reshape(ROWS, D)
        grid = w[f"{TOWER}.patch_embed.pos_emb.weight"]  # [H0, W0, D]
        pos = []
        for h, wd in GRIDS:
            if (h, wd) == (H0, W0):
                pos.append(grid.reshape(-1, D))
            else:
                r = F.interpolate(grid.permute(2, 0, 1)[None], size=(h, wd), mode="bicubic")
                pos.append(r[0].permute(1, 2, 0).reshape(-1, D))
        x = x + torch.cat(pos)
        cis = torch.polar(torch.ones(ROWS, HD // 2),
                          torch.cat([rope_angles(h, wd) for h, wd in GRIDS]))[:, None, :]
        starts = [0]
        for h, wd in GRIDS:
            starts.append(starts[-1] + h * wd)
        for l in range(LAYERS):
            b = f"{TOWER}.encoder.blocks.{l}"
            n0 = F.layer_norm(x, (D,), w[f"{b}.norm0.weight"], w[f"{b}.norm0.bias"], EPS)
            qkv = F.linear(n0, w[f"{b}.wqkv.weight"], w[f"{b}.wqkv.bias"]).reshape(ROWS, 3, H, HD)
            q, k, v = qkv.unbind(1)
            q = torch.view_as_real(torch.view_as_complex(q.reshape(ROWS, H, HD // 2, 2)) * cis)
            k = torch.view_as_real(torch.view_as_complex(k.reshape(ROWS, H, HD // 2, 2)) * cis)
            q, k = q.reshape(ROWS, H, HD), k.reshape(ROWS, H, HD)
            outs = []
            for a, e in zip(starts, starts[1:]):
                o = F.scaled_dot_product_attention(q[a:e].transpose(0, 1), k[a:e].transpose(0, 1),
                                                   v[a:e].transpose(0, 1))
                outs.append(o.transpose(0, 1).reshape(e - a, D))
            x = x + F.linear(torch.cat(outs), w[f"{b}.wo.weight"], w[f"{b}.wo.bias"])
            n1 = F.layer_norm(x, (D,), w[f"{b}.norm1.weight"], w[f"{b}.norm1.bias"], EPS)
            hmid = F.gelu(F.linear(n1, w[f"{b}.mlp.fc0.weight"], w[f"{b}.mlp.fc0.bias"]),
                          approximate="tanh")
            x = x + F.linear(hmid, w[f"{b}.mlp.fc1.weight"], w[f"{b}.mlp.fc1.bias"])
        x = F.layer_norm(x, (D,), w[f"{TOWER}.encoder.final_layernorm.weight"],
                         w[f"{TOWER}.encoder.final_layernorm.bias"], EPS)
        merged = []
        for (a, e), (h, wd) in zip(zip(starts, starts[1:]), GRIDS):
            s = x[a:e].view(h // KH, KH, wd // KW, KW, D).permute(0, 2, 1, 3, 4)
            merged.append(s.reshape(-1, KH * KW, D))
        feats = torch.cat(merged)
        y = F.layer_norm(feats, (D,), w[f"{PROJ}.pre_norm.weight"], w[f"{PROJ}.pre_norm.bias"],
                         EPS).reshape(-1, KH * KW * D)
        y = F.gelu(F.linear(y, w[f"{PROJ}.linear_1.weight"], w[f"{PROJ}.linear_1.bias"]))
        y = F.linear(y, w[f"{PROJ}.linear_2.weight"], w[f"{PROJ}.linear_2.bias"])
    emit(y.reshape(-1).tolist(),
         f"torch {torch.__version__}, vLLM 0.19.0's MoonViT and KimiVLMultiModalProjector "
         f"rendered in PyTorch ops (F.conv2d, F.interpolate bicubic, torch.polar, "
         f"F.scaled_dot_product_attention), fp32 CPU")
    sys.exit(0)

# --pure: the same math in plain Python lists.
w = common.load_dir(root)


def linear(xs, name, n, k):
    wt, bs = w[name + ".weight"], w[name + ".bias"]
    return [[bs[o] + sum(wt[o * k + j] * r[j] for j in range(k)) for o in range(n)] for r in xs]


def layer_norm(xs, name, d):
    g, bs = w[name + ".weight"], w[name + ".bias"]
    out = []
    for r in xs:
        m = sum(r) / d
        var = sum((v - m) ** 2 for v in r) / d
        s = 1.0 / math.sqrt(var + EPS)
        out.append([(r[j] - m) * s * g[j] + bs[j] for j in range(d)])
    return out


def gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def cubic(t):
    a = -0.75
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def taps(n_in, n_out):
    out = []
    for o in range(n_out):
        real = n_in / n_out * (o + 0.5) - 0.5
        f = math.floor(real)
        idx = [min(max(f + j, 0), n_in - 1) for j in (-1, 0, 1, 2)]
        out.append((idx, cubic(real - f)))
    return out


def resize(h, wd):
    g = w[f"{TOWER}.patch_embed.pos_emb.weight"]
    at = lambda y, x, c: g[(y * W0 + x) * D + c]
    ty, tx = taps(H0, h), taps(W0, wd)
    out = []
    for yi, yc in ty:
        for xi, xc in tx:
            out.append([sum(yc[a] * sum(xc[b] * at(yi[a], xi[b], c) for b in range(4))
                            for a in range(4)) for c in range(D)])
    return out


pw, pb = w[f"{TOWER}.patch_embed.proj.weight"], w[f"{TOWER}.patch_embed.proj.bias"]
x = [[pb[o] + sum(pw[o * K + j] * PIXELS[r * K + j] for j in range(K)) for o in range(D)]
     for r in range(ROWS)]
pos, angles = [], []
for h, wd in GRIDS:
    if (h, wd) == (H0, W0):
        g = w[f"{TOWER}.patch_embed.pos_emb.weight"]
        pos += [g[i * D:(i + 1) * D] for i in range(h * wd)]
    else:
        pos += resize(h, wd)
    freqs = [THETA ** (-(4 * i) / HD) for i in range(HD // 4)]
    for r in range(h):
        for c in range(wd):
            a = []
            for f in freqs:
                a += [c * f, r * f]
            angles.append(a)
x = [[a + b for a, b in zip(r, p)] for r, p in zip(x, pos)]
starts = [0]
for h, wd in GRIDS:
    starts.append(starts[-1] + h * wd)


def rope(v, t):
    out = list(v)
    for hh in range(H):
        for j, ang in enumerate(angles[t]):
            k = hh * HD + 2 * j
            re, im = v[k], v[k + 1]
            out[k] = re * math.cos(ang) - im * math.sin(ang)
            out[k + 1] = re * math.sin(ang) + im * math.cos(ang)
    return out


for l in range(LAYERS):
    b = f"{TOWER}.encoder.blocks.{l}"
    qkv = linear(layer_norm(x, f"{b}.norm0", D), f"{b}.wqkv", 3 * D, D)
    q = [rope(r[:D], t) for t, r in enumerate(qkv)]
    k = [rope(r[D:2 * D], t) for t, r in enumerate(qkv)]
    v = [r[2 * D:] for r in qkv]
    o = [[0.0] * D for _ in range(ROWS)]
    for a, e in zip(starts, starts[1:]):
        for hh in range(H):
            sl = slice(hh * HD, (hh + 1) * HD)
            for t in range(a, e):
                s = [sum(p * m for p, m in zip(q[t][sl], k[u][sl])) / math.sqrt(HD)
                     for u in range(a, e)]
                mx = max(s)
                ex = [math.exp(z - mx) for z in s]
                tot = sum(ex)
                for c in range(HD):
                    o[t][hh * HD + c] = sum(ex[u - a] * v[u][hh * HD + c]
                                            for u in range(a, e)) / tot
    x = [[p + m for p, m in zip(r, s)] for r, s in zip(x, linear(o, f"{b}.wo", D, D))]
    hm = linear(layer_norm(x, f"{b}.norm1", D), f"{b}.mlp.fc0", I, D)
    hm = [[gelu_tanh(z) for z in r] for r in hm]
    x = [[p + m for p, m in zip(r, s)] for r, s in zip(x, linear(hm, f"{b}.mlp.fc1", D, I))]
x = layer_norm(x, f"{TOWER}.encoder.final_layernorm", D)
tokens = []
for (a, _), (h, wd) in zip(zip(starts, starts[1:]), GRIDS):
    for bi in range(h // KH):
        for bj in range(wd // KW):
            tokens.append([x[a + (bi * KH + ki) * wd + bj * KW + kj]
                           for ki in range(KH) for kj in range(KW)])
PW = KH * KW * D
TH = len(w[f"{PROJ}.linear_2.bias"])
y = [sum(layer_norm(t, f"{PROJ}.pre_norm", D), []) for t in tokens]
y = [[gelu(z) for z in r] for r in linear(y, f"{PROJ}.linear_1", PW, PW)]
y = linear(y, f"{PROJ}.linear_2", TH, PW)
emit([v for r in y for v in r],
     "plain Python (no torch): vLLM 0.19.0's MoonViT and KimiVLMultiModalProjector, the same "
     "math as the torch mode, in double precision")
