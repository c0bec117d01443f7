#!/usr/bin/env python3
"""Reference image features for tests/llava_next_reference.rs: LLaVA-NeXT's SigLIP vision tower
through its feature layers and `multi_modal_projector` (transformers'
`LlavaNextForConditionalGeneration.get_image_features`: the tower's `hidden_states` at
`vision_feature_layer`, concatenated along the width, then `linear_1`, GELU, `linear_2`) in
fp32 on the CPU, on the small seeded `llava_next` checkpoint the test writes with gen-model.

Fixture:  VRAMSCOPE_LLAVA_NEXT_FIXTURE=DIR cargo test --test llava_next_reference -- --ignored write_fixture
Run:      python3 scripts/llava_next_reference.py DIR          (transformers + torch, fp32 CPU)
          python3 scripts/llava_next_reference.py DIR --pure   (the same math in plain Python,
                                                               for a machine without torch)

The crops are the test's: crop n, channel c, row y, column x holds
sin(0.013 * ((c * S + y) * S + x) + 0.5 * n). One image of the first grid pinpoint's size,
so its crops are the base and the pinpoint's tiles. Prints the projected crops
[crops * patches, text hidden] as a Rust array (HF_EMBEDS), then the image they merge into
(HF_MERGED: `pack_image_features`, the base crop then the unpadded tiles' rows each closed by
`image_newline`, what vLLM's `_merge_image_patch_embeddings` "spatial_unpad" makes).
"""
import json
import math
import os
import sys

import vision_reference_common as common

root = sys.argv[1]
pure = "--pure" in sys.argv
cfg = json.load(open(os.path.join(root, "config.json")))
vc, tc = cfg["vision_config"], cfg["text_config"]
S, P, C = vc["image_size"], vc["patch_size"], vc.get("num_channels", 3)
D, I, L, H = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"], vc["num_attention_heads"]
EPS = vc.get("layer_norm_eps", 1e-6)
TH = tc["hidden_size"]
LAYERS = cfg["vision_feature_layer"]
LAYERS = [LAYERS] if isinstance(LAYERS, int) else LAYERS
assert cfg.get("vision_feature_select_strategy") == "full", "the test's checkpoint selects every patch"
PH, PW = cfg["image_grid_pinpoints"][0]
CROPS = 1 + (PH // S) * (PW // S)


def pixel(n, c, y, x):
    return common.pixel(S, n, c, y, x)


def emit(values, how):
    common.emit(values, how, CROPS)


def emit_merged(values):
    print(f"// the merged image: {len(values)} values")
    print(f"const HF_MERGED: [f64; {len(values)}] = [")
    for i in range(0, len(values), 6):
        print("    " + ", ".join(f"{v:.8e}" for v in values[i:i + 6]) + ",")
    print("];")


def unpad_window(rows, cols, g):
    """transformers' unpad_image on the [rows * g, cols * g] planes of a PH x PW image:
    (top, left, height, width)."""
    ch, cw = rows * g, cols * g
    if PW / PH > cw / ch:
        new_h = int(round(PH * (cw / PW), 7))
        pad = (ch - new_h) // 2
        return pad, 0, ch - 2 * pad, cw
    new_w = int(round(PW * (ch / PH), 7))
    pad = (cw - new_w) // 2
    return 0, pad, ch, cw - 2 * pad


if not pure:
    import torch
    from importlib.metadata import version
    from transformers import LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration.from_pretrained(root, dtype=torch.float32).eval()
    px = torch.tensor([[[[pixel(n, c, y, x) for x in range(S)] for y in range(S)]
                        for c in range(C)] for n in range(CROPS)], dtype=torch.float32)
    inner = getattr(model, "model", model)
    with torch.no_grad():
        # What `get_image_features` composes: every hidden state of the tower, the feature
        # layers' concatenated, the projector.
        hs = inner.vision_tower(pixel_values=px, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in LAYERS], dim=-1)
        out = inner.multi_modal_projector(feats)
        got = model.get_image_features(pixel_values=px[None], image_sizes=torch.tensor([[PH, PW]]),
                                       vision_feature_layer=cfg["vision_feature_layer"],
                                       vision_feature_select_strategy="full")
        got = getattr(got, "pooler_output", got)
        got = torch.cat(list(got), dim=0) if isinstance(got, (list, tuple)) else got
        if torch.is_tensor(got) and got.numel() == out.numel():
            d = (got.reshape(-1) - out.reshape(-1)).norm() / out.norm()
            print(f"// get_image_features agrees with tower + projector: relative L2 {d:.2e}",
                  file=sys.stderr)
        else:
            print(f"// get_image_features returned {type(got)}, not compared", file=sys.stderr)
        merged, _ = inner.pack_image_features([out], torch.tensor([[PH, PW]]), "full",
                                              image_newline=inner.image_newline)
        # transformers 5.17 returns the images as a list.
        merged = torch.cat(list(merged), dim=0) if isinstance(merged, (list, tuple)) else merged
    emit(out.reshape(-1).tolist(),
         f"transformers {version('transformers')}, torch {torch.__version__}, "
         f"{type(model).__name__}: vision_tower hidden_states {LAYERS} then multi_modal_projector, fp32 CPU")
    emit_merged(merged.reshape(-1).tolist())
    sys.exit(0)


# Plain Python: the safetensors file (f16/bf16/f32), then transformers' math step by step.

W = common.load_dir(root)
V = "vision_tower.vision_model"


def linear(x, w, b, n, k):
    # x: rows of k; w: [n, k]
    return [[sum(r[j] * w[o * k + j] for j in range(k)) + (b[o] if b else 0.0) for o in range(n)]
            for r in x]


def layer_norm(x, w, b):
    out = []
    for r in x:
        m = sum(r) / len(r)
        var = sum((v - m) ** 2 for v in r) / len(r)
        s = 1.0 / math.sqrt(var + EPS)
        out.append([(v - m) * s * w[j] + b[j] for j, v in enumerate(r)])
    return out


def gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def gelu_erf(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


g = S // P
hd = D // H
result = []
for n in range(CROPS):
    cw, cb = W[f"{V}.embeddings.patch_embedding.weight"], W[f"{V}.embeddings.patch_embedding.bias"]
    pos = W[f"{V}.embeddings.position_embedding.weight"]
    h = []
    for gy in range(g):
        for gx in range(g):
            col = [pixel(n, c, gy * P + py, gx * P + px) for c in range(C) for py in range(P) for px in range(P)]
            k = len(col)
            row = [cb[o] + sum(cw[o * k + j] * col[j] for j in range(k)) for o in range(D)]
            pi = gy * g + gx
            h.append([row[o] + pos[pi * D + o] for o in range(D)])
    states = [h]
    for l in range(L):
        p = f"{V}.encoder.layers.{l}"
        res = h
        x = layer_norm(h, W[f"{p}.layer_norm1.weight"], W[f"{p}.layer_norm1.bias"])
        q = linear(x, W[f"{p}.self_attn.q_proj.weight"], W[f"{p}.self_attn.q_proj.bias"], D, D)
        kk = linear(x, W[f"{p}.self_attn.k_proj.weight"], W[f"{p}.self_attn.k_proj.bias"], D, D)
        vv = linear(x, W[f"{p}.self_attn.v_proj.weight"], W[f"{p}.self_attn.v_proj.bias"], D, D)
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
        o = linear(att, W[f"{p}.self_attn.out_proj.weight"], W[f"{p}.self_attn.out_proj.bias"], D, D)
        h = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(res, o)]
        res = h
        x = layer_norm(h, W[f"{p}.layer_norm2.weight"], W[f"{p}.layer_norm2.bias"])
        x = linear(x, W[f"{p}.mlp.fc1.weight"], W[f"{p}.mlp.fc1.bias"], I, D)
        x = [[gelu_tanh(v) for v in r] for r in x]
        x = linear(x, W[f"{p}.mlp.fc2.weight"], W[f"{p}.mlp.fc2.bias"], D, I)
        h = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(res, x)]
        states.append(h)
    # hidden_states[i] for each feature layer (negative from the end), side by side.
    feats = [sum((states[i][t] for i in LAYERS), []) for t in range(g * g)]
    F = D * len(LAYERS)
    x = linear(feats, W["multi_modal_projector.linear_1.weight"], W["multi_modal_projector.linear_1.bias"], TH, F)
    x = [[gelu_erf(v) for v in r] for r in x]
    x = linear(x, W["multi_modal_projector.linear_2.weight"], W["multi_modal_projector.linear_2.bias"], TH, TH)
    for r in x:
        result.extend(r)
emit(result, "plain Python (transformers' SiglipVisionModel hidden_states and LlavaNextMultiModalProjector math), fp64")

# pack_image_features: the base crop, then the tiles as one [rows * g, cols * g] grid of
# patches, unpadded, each row closed by image_newline.
rows, cols = PH // S, PW // S
crop = [result[n * g * g * TH:(n + 1) * g * g * TH] for n in range(CROPS)]
newline = W["image_newline"]
top, left, ch, cw = unpad_window(rows, cols, g)
merged = list(crop[0])
for y in range(top, top + ch):
    for x in range(left, left + cw):
        t = 1 + (y // g) * cols + x // g
        p = (y % g) * g + x % g
        merged.extend(crop[t][p * TH:(p + 1) * TH])
    merged.extend(newline)
emit_merged(merged)
