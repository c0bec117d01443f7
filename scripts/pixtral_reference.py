#!/usr/bin/env python3
"""Reference image embeddings for tests/pixtral_reference.rs: Mistral 3's Pixtral vision tower
and multimodal projector (transformers' `Mistral3ForConditionalGeneration`:
`model.vision_tower(pixel_values, image_sizes=...)`'s `last_hidden_state`, then
`model.multi_modal_projector(features, image_sizes)`) in fp32 on the CPU, on the small seeded
`mistral3` checkpoint the test writes with gen-model.

Fixture:  VRAMSCOPE_PIXTRAL_FIXTURE=DIR cargo test --test pixtral_reference -- --ignored write_fixture
Run:      python3 scripts/pixtral_reference.py DIR            (transformers 5.17 + torch 2.11,
                                                              fp32 CPU)
          python3 scripts/pixtral_reference.py DIR --pure     (the same math in plain Python,
                                                              for a machine without torch)

The pixels are the test's: image n, channel c, row y, column x holds
sin(0.013 * ((c * S + y) * S + x) + 0.5 * n), every image S x S (the largest size). Prints the
embeddings [N * tokens, text hidden] as a Rust array.
"""
import json
import math
import os
import sys

import vision_reference_common as common

root = sys.argv[1]
pure = "--pure" in sys.argv
IMAGES = 2
cfg = json.load(open(os.path.join(root, "config.json")))
vc, tc = cfg["vision_config"], cfg["text_config"]
S, P, C = vc["image_size"], vc["patch_size"], vc.get("num_channels", 3)
D, I, L, H = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"], vc["num_attention_heads"]
THETA = vc.get("rope_theta", 10000.0)
TH = tc["hidden_size"]
M = cfg.get("spatial_merge_size", 2)
EPS = 1e-5


def pixel(n, c, y, x):
    return common.pixel(S, n, c, y, x)


def emit(values, how):
    common.emit(values, how, IMAGES)


if not pure:
    import torch
    from importlib.metadata import version
    from transformers import Mistral3ForConditionalGeneration

    model = Mistral3ForConditionalGeneration.from_pretrained(root, dtype=torch.float32).eval()
    px = torch.tensor([[[[pixel(n, c, y, x) for x in range(S)] for y in range(S)]
                        for c in range(C)] for n in range(IMAGES)], dtype=torch.float32)
    sizes = torch.tensor([[S, S]] * IMAGES)
    with torch.no_grad():
        # What `get_image_features` composes for vision_feature_layer -1: the tower's last
        # hidden state [1, N * patches, D], squeezed, then the projector with the image sizes.
        layer = cfg.get("vision_feature_layer", -1)
        if layer == -1:
            hidden = model.model.vision_tower(px, image_sizes=sizes).last_hidden_state
        else:
            tower = model.model.vision_tower(px, image_sizes=sizes, output_hidden_states=True)
            hidden = tower.hidden_states[layer]
        out = model.model.multi_modal_projector(hidden.squeeze(0), sizes)
        try:
            feats = model.model.get_image_features(pixel_values=px, image_sizes=sizes)
            pooled = getattr(feats, "pooler_output", feats)
            if isinstance(pooled, (list, tuple)):
                pooled = torch.cat(list(pooled))
            if torch.is_tensor(pooled) and pooled.numel() == out.numel():
                d = (pooled.reshape(-1) - out.reshape(-1)).norm() / out.norm()
                print(f"// get_image_features agrees with tower + projector: relative L2 {d:.2e}",
                      file=sys.stderr)
        except Exception as e:  # the cross-check only; the tower + projector are the reference
            print(f"// get_image_features not compared: {e}", file=sys.stderr)
    emit(out.reshape(-1).tolist(),
         f"transformers {version('transformers')}, torch {torch.__version__}, "
         f"{type(model).__name__}: vision_tower then multi_modal_projector, fp32 CPU")
    sys.exit(0)


# Plain Python: the safetensors file (f16/bf16/f32), then transformers' math step by step.


W = common.load_dir(root)
V = "vision_tower"
PR = "multi_modal_projector"


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


g = S // P
hd = D // H
# PixtralRotaryEmbedding: freqs[j] = theta^(-2j/hd); rows take freqs[::2], columns freqs[1::2].
freqs = [1.0 / THETA ** (2 * j / hd) for j in range(hd // 2)]


def angles(r, c):
    a = [r * f for f in freqs[::2]] + [c * f for f in freqs[1::2]]
    return a + a


def rope(x, cs):
    out = []
    for t, row in enumerate(x):
        cos, sin = cs[t]
        o = []
        for h in range(H):
            v = row[h * hd:(h + 1) * hd]
            rot = [-v[j + hd // 2] for j in range(hd // 2)] + v[:hd // 2]
            o.extend(v[j] * cos[j] + rot[j] * sin[j] for j in range(hd))
        out.append(o)
    return out


cs = []
for gy in range(g):
    for gx in range(g):
        a = angles(gy, gx)
        cs.append(([math.cos(v) for v in a], [math.sin(v) for v in a]))
layer = cfg.get("vision_feature_layer", -1)
used = L + layer + 1 if layer < 0 else layer
result = []
for n in range(IMAGES):
    cw = W[f"{V}.patch_conv.weight"]
    h = []
    for gy in range(g):
        for gx in range(g):
            col = [pixel(n, c, gy * P + py, gx * P + px) for c in range(C) for py in range(P) for px in range(P)]
            k = len(col)
            h.append([sum(cw[o * k + j] * col[j] for j in range(k)) for o in range(D)])
    h = rms_norm(h, W[f"{V}.ln_pre.weight"])
    for l in range(used):
        p = f"{V}.transformer.layers.{l}"
        x = rms_norm(h, W[f"{p}.attention_norm.weight"])
        q = rope(linear(x, W[f"{p}.attention.q_proj.weight"], D, D), cs)
        kk = rope(linear(x, W[f"{p}.attention.k_proj.weight"], D, D), cs)
        vv = linear(x, W[f"{p}.attention.v_proj.weight"], D, D)
        att = [[0.0] * D for _ in h]
        for hh in range(H):
            for i in range(len(h)):
                s = [sum(q[i][hh * hd + d] * kk[j][hh * hd + d] for d in range(hd)) * hd ** -0.5
                     for j in range(len(h))]
                mx = max(s)
                e = [math.exp(v - mx) for v in s]
                z = sum(e)
                for d in range(hd):
                    att[i][hh * hd + d] = sum(e[j] / z * vv[j][hh * hd + d] for j in range(len(h)))
        o = linear(att, W[f"{p}.attention.o_proj.weight"], D, D)
        h = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(h, o)]
        x = rms_norm(h, W[f"{p}.ffn_norm.weight"])
        gt = linear(x, W[f"{p}.feed_forward.gate_proj.weight"], I, D)
        up = linear(x, W[f"{p}.feed_forward.up_proj.weight"], I, D)
        x = [[silu(a) * b for a, b in zip(r1, r2)] for r1, r2 in zip(gt, up)]
        x = linear(x, W[f"{p}.feed_forward.down_proj.weight"], D, I)
        h = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(h, x)]
    # Mistral3MultiModalProjector: RMSNorm, the patch merger (unfold of M x M blocks, channel
    # first), merging_layer, linear_1, GELU, linear_2.
    h = rms_norm(h, W[f"{PR}.norm.weight"])
    side = g // M
    merged = [[h[(M * ly + ky) * g + M * lx + kx][c] for c in range(D) for ky in range(M) for kx in range(M)]
              for ly in range(side) for lx in range(side)]
    x = linear(merged, W[f"{PR}.patch_merger.merging_layer.weight"], D, D * M * M)
    x = linear(x, W[f"{PR}.linear_1.weight"], TH, D, W.get(f"{PR}.linear_1.bias"))
    x = [[gelu(v) for v in r] for r in x]
    x = linear(x, W[f"{PR}.linear_2.weight"], TH, TH, W.get(f"{PR}.linear_2.bias"))
    for r in x:
        result.extend(r)
emit(result, "plain Python (transformers' PixtralVisionModel and Mistral3MultiModalProjector math), fp64")
