#!/usr/bin/env python3
"""Reference image embeddings for tests/siglip_reference.rs: Gemma 3's SigLIP vision tower and
multimodal projector (transformers' `Gemma3Model.get_image_features`: `SiglipVisionModel`'s
`last_hidden_state`, then `Gemma3MultiModalProjector`) in fp32 on the CPU, on the small seeded
`gemma3` checkpoint the test writes with gen-model.

Fixture:  VRAMSCOPE_SIGLIP_FIXTURE=DIR cargo test --test siglip_reference -- --ignored write_fixture
Run:      python3 scripts/siglip_reference.py DIR            (transformers + torch, fp32 CPU)
          python3 scripts/siglip_reference.py DIR --pure     (the same math in plain Python,
                                                             for a machine without torch)

The pixels are the test's: image n, channel c, row y, column x holds
sin(0.013 * ((c * S + y) * S + x) + 0.5 * n). Prints the embeddings [N * tokens, hidden] as a
Rust array.
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
EPS = vc.get("layer_norm_eps", 1e-6)
TH = tc["hidden_size"]
T = cfg["mm_tokens_per_image"]


def pixel(n, c, y, x):
    return common.pixel(S, n, c, y, x)


def emit(values, how):
    common.emit(values, how, IMAGES)


if not pure:
    import torch
    from importlib.metadata import version
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(root, dtype=torch.float32).eval()
    px = torch.tensor([[[[pixel(n, c, y, x) for x in range(S)] for y in range(S)]
                        for c in range(C)] for n in range(IMAGES)], dtype=torch.float32)
    with torch.no_grad():
        # What `get_image_features` composes (transformers 5 returns it inside a model output):
        # the tower's last hidden state, then the projector.
        hidden = model.model.vision_tower(pixel_values=px).last_hidden_state
        out = model.model.multi_modal_projector(hidden)
        feats = model.model.get_image_features(pixel_values=px)
        pooled = getattr(feats, "pooler_output", feats)
        if torch.is_tensor(pooled) and pooled.numel() == out.numel():
            d = (pooled.reshape(-1) - out.reshape(-1)).norm() / out.norm()
            print(f"// get_image_features agrees with tower + projector: relative L2 {d:.2e}",
                  file=sys.stderr)
    emit(out.reshape(-1).tolist(),
         f"transformers {version('transformers')}, torch {torch.__version__}, "
         f"{type(model).__name__}: vision_tower then multi_modal_projector, fp32 CPU")
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


g = S // P
hd = D // H
result = []
for n in range(IMAGES):
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
    h = layer_norm(h, W[f"{V}.post_layernorm.weight"], W[f"{V}.post_layernorm.bias"])
    # Gemma3MultiModalProjector: [P, D] as [D, g, g], AvgPool2d(k), [T, D], Gemma3RMSNorm, @ W.
    side = int(math.isqrt(T))
    k = g // side
    pooled = [[sum(h[(ty * k + y) * g + tx * k + x][d] for y in range(k) for x in range(k)) / (k * k)
               for d in range(D)] for ty in range(side) for tx in range(side)]
    nw = W["multi_modal_projector.mm_soft_emb_norm.weight"]
    pw = W["multi_modal_projector.mm_input_projection_weight"]
    for r in pooled:
        ms = sum(v * v for v in r) / D
        s = 1.0 / math.sqrt(ms + EPS)
        nr = [v * s * (1.0 + nw[d]) for d, v in enumerate(r)]
        result.extend(sum(nr[d] * pw[d * TH + o] for d in range(D)) for o in range(TH))
emit(result, "plain Python (transformers' SiglipVisionModel and Gemma3MultiModalProjector math), fp64")
