#!/usr/bin/env python3
"""Reference image embeddings for tests/qwen2_5_vl_reference.rs: Qwen2.5-VL's vision tower and
patch merger (transformers' `Qwen2_5_VLForConditionalGeneration`: `model.visual(pixel_values,
grid_thw=...)`, the merged embeddings in the images' order) in fp32 on the CPU, on the small
seeded `qwen2_5_vl` checkpoint the test writes with gen-model.

Fixture:  VRAMSCOPE_QWEN2_5_VL_FIXTURE=DIR cargo test --test qwen2_5_vl_reference -- --ignored write_fixture
Run:      python3 scripts/qwen2_5_vl_reference.py DIR > tests/fixtures/qwen2_5_vl/reference.rs
                                        (transformers 5.17 + torch 2.11, fp32 CPU)
          python3 scripts/qwen2_5_vl_reference.py DIR --pure > ...
                                        (the same math in plain Python, without torch)

The pixels are the test's: `pixel_values [sum t*h*w, C*T*p*p]` whose flat element i holds
sin(0.013 * i), for the grids (t, h, w) (1, 6, 10) and (2, 4, 6). Prints the embeddings
[sum t*h*w / merge^2, out_hidden_size] as a Rust array.
"""
import json
import math
import os
import sys

import vision_reference_common as common

root = sys.argv[1]
pure = "--pure" in sys.argv
GRIDS = [(1, 6, 10), (2, 4, 6)]
cfg = json.load(open(os.path.join(root, "config.json")))
vc = cfg["vision_config"]
tc = cfg.get("text_config") or cfg
D, I, DEPTH, H = vc["hidden_size"], vc["intermediate_size"], vc["depth"], vc["num_heads"]
P, TP, M = vc["patch_size"], vc["temporal_patch_size"], vc["spatial_merge_size"]
C = vc.get("in_channels", vc.get("in_chans", 3))
WS = vc["window_size"] // M // P
FULL = set(vc["fullatt_block_indexes"])
OUT = vc["out_hidden_size"]
EPS = tc.get("rms_norm_eps", 1e-6)
K = C * TP * P * P
ROWS = sum(t * h * w for t, h, w in GRIDS)
PIXELS = [math.sin(0.013 * i) for i in range(ROWS * K)]


def emit(values, how):
    common.emit(values, how, len(GRIDS))


if not pure:
    import torch
    from importlib.metadata import version
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(root, dtype=torch.float32).eval()
    visual = model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") \
        else model.visual
    px = torch.tensor(PIXELS, dtype=torch.float32).reshape(ROWS, K)
    thw = torch.tensor(GRIDS, dtype=torch.long)
    with torch.no_grad():
        out = visual(px, grid_thw=thw)
        # transformers 5 returns an output object: the merged embeddings are its
        # `pooler_output` (the last hidden state is before the merger).
        if not torch.is_tensor(out):
            pooled = getattr(out, "pooler_output", None)
            out = pooled if pooled is not None else out[0]
        if out.shape[-1] != OUT:
            raise SystemExit(f"the tower's output is {tuple(out.shape)}, not [*, {OUT}]")
        try:
            feats = model.model.get_image_features(pixel_values=px, image_grid_thw=thw)
            pooled = getattr(feats, "pooler_output", feats)
            if isinstance(pooled, (list, tuple)):
                pooled = torch.cat(list(pooled))
            if torch.is_tensor(pooled) and pooled.numel() == out.numel():
                d = (pooled.reshape(-1) - out.reshape(-1)).norm() / out.norm()
                print(f"// get_image_features agrees with model.visual: relative L2 {d:.2e}",
                      file=sys.stderr)
        except Exception as e:  # the cross-check only
            print(f"// get_image_features not compared: {e}", file=sys.stderr)
    emit(out.reshape(-1).tolist(),
         f"transformers {version('transformers')}, torch {torch.__version__}, "
         f"{type(model).__name__}: model.visual(pixel_values, grid_thw), fp32 CPU")
    sys.exit(0)


# Plain Python: the safetensors file, then transformers' Qwen2_5_VisionTransformer math.

W = common.load_dir(root)
V = "visual" if "visual.patch_embed.proj.weight" in W else "model.visual"


def linear(x, w, n, k, b=None):
    return [[sum(r[j] * w[o * k + j] for j in range(k)) + (b[o] if b else 0.0) for o in range(n)]
            for r in x]


def rms_norm(x, w):
    out = []
    for r in x:
        s = 1.0 / math.sqrt(sum(v * v for v in r) / len(r) + EPS)
        out.append([v * s * w[j] for j, v in enumerate(r)])
    return out


def silu(v):
    return v / (1.0 + math.exp(-v))


def gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


hd = D // H
rot = hd // 2
inv_freq = [1.0 / 10000.0 ** (2 * j / rot) for j in range(rot // 2)]


def window_index(t, h, w):
    """get_window_index for one image: merged tokens in window order and window lengths."""
    lh, lw = h // M, w // M
    nh, nw = (lh + WS - lh % WS) // WS, (lw + WS - lw % WS) // WS
    index, lens = [], []
    for f in range(t):
        for wy in range(nh):
            for wx in range(nw):
                cur = [(f * lh + y) * lw + x for y in range(wy * WS, min((wy + 1) * WS, lh))
                       for x in range(wx * WS, min((wx + 1) * WS, lw))]
                index += cur
                if cur:
                    lens.append(len(cur) * M * M)
    return index, lens


# rot_pos_emb: per patch in the processor's order (M x M blocks contiguous), per frame.
angles = []
index, cu_window, cu_full = [], [0], [0]
for t, h, w in GRIDS:
    for _ in range(t):
        for by in range(h // M):
            for bx in range(w // M):
                for iy in range(M):
                    for ix in range(M):
                        y, x = by * M + iy, bx * M + ix
                        angles.append([y * f for f in inv_freq] + [x * f for f in inv_freq])
    base = len(index)
    idx, lens = window_index(t, h, w)
    index += [i + base for i in idx]
    for n in lens:
        cu_window.append(cu_window[-1] + n)
    for _ in range(t):
        cu_full.append(cu_full[-1] + h * w)

x = [PIXELS[r * K:(r + 1) * K] for r in range(ROWS)]
h = linear(x, W[f"{V}.patch_embed.proj.weight"], D, K)
U = M * M
h = [h[i * U + u] for i in index for u in range(U)]
angles = [angles[i * U + u] for i in index for u in range(U)]
cos = [[math.cos(a) for a in r] for r in angles]
sin = [[math.sin(a) for a in r] for r in angles]


def rope(xs):
    out = []
    for t, row in enumerate(xs):
        o = []
        for hh in range(H):
            v = row[hh * hd:(hh + 1) * hd]
            c = cos[t] + cos[t]
            s = sin[t] + sin[t]
            rh = [-v[j + hd // 2] for j in range(hd // 2)] + v[:hd // 2]
            o.extend(v[j] * c[j] + rh[j] * s[j] for j in range(hd))
        out.append(o)
    return out


for l in range(DEPTH):
    p = f"{V}.blocks.{l}"
    cu = cu_full if l in FULL else cu_window
    xn = rms_norm(h, W[f"{p}.norm1.weight"])
    qkv = linear(xn, W[f"{p}.attn.qkv.weight"], 3 * D, D, W[f"{p}.attn.qkv.bias"])
    q = rope([r[:D] for r in qkv])
    k = rope([r[D:2 * D] for r in qkv])
    v = [r[2 * D:] for r in qkv]
    att = [[0.0] * D for _ in h]
    for a, b in zip(cu[:-1], cu[1:]):
        for hh in range(H):
            for i in range(a, b):
                s = [sum(q[i][hh * hd + d] * k[j][hh * hd + d] for d in range(hd)) * hd ** -0.5
                     for j in range(a, b)]
                mx = max(s)
                e = [math.exp(z - mx) for z in s]
                zs = sum(e)
                for d in range(hd):
                    att[i][hh * hd + d] = sum(e[j - a] / zs * v[j][hh * hd + d] for j in range(a, b))
    o = linear(att, W[f"{p}.attn.proj.weight"], D, D, W[f"{p}.attn.proj.bias"])
    h = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(h, o)]
    xn = rms_norm(h, W[f"{p}.norm2.weight"])
    g = linear(xn, W[f"{p}.mlp.gate_proj.weight"], I, D, W[f"{p}.mlp.gate_proj.bias"])
    u = linear(xn, W[f"{p}.mlp.up_proj.weight"], I, D, W[f"{p}.mlp.up_proj.bias"])
    y = linear([[silu(a) * b for a, b in zip(r1, r2)] for r1, r2 in zip(g, u)],
               W[f"{p}.mlp.down_proj.weight"], D, I, W[f"{p}.mlp.down_proj.bias"])
    h = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(h, y)]

# Qwen2_5_VLPatchMerger: ln_q, the [L / M^2, M^2 * D] view, Linear, GELU, Linear; then the
# window order undone (argsort of the window index).
h = rms_norm(h, W[f"{V}.merger.ln_q.weight"])
merged = [sum(h[i * U:(i + 1) * U], []) for i in range(len(h) // U)]
y = linear(merged, W[f"{V}.merger.mlp.0.weight"], D * U, D * U, W[f"{V}.merger.mlp.0.bias"])
y = [[gelu(z) for z in r] for r in y]
y = linear(y, W[f"{V}.merger.mlp.2.weight"], OUT, D * U, W[f"{V}.merger.mlp.2.bias"])
out = [None] * len(y)
for pos, i in enumerate(index):
    out[i] = y[pos]
emit([z for r in out for z in r],
     "plain Python (transformers' Qwen2_5_VisionTransformer and Qwen2_5_VLPatchMerger math), fp64")
