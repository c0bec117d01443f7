#!/usr/bin/env python3
"""Reference image features for tests/llama4_vision_reference.rs: Llama 4's vision model and
projector (transformers' `Llama4VisionModel`: the unfold patch embedding, the class token, the
positional embedding, `layernorm_pre`, the encoder with its 2D vision rotary, `layernorm_post`,
the class token dropped, the pixel shuffle and `Llama4VisionPixelShuffleMLP`; then
`Llama4MultiModalProjector.linear_1`) in fp32 on the CPU, on the small seeded `llama4`
checkpoint the test writes with gen-model.

Fixture:  VRAMSCOPE_LLAMA4_VISION_FIXTURE=DIR cargo test --test llama4_vision_reference -- --ignored write_fixture
Run:      python3 scripts/llama4_vision_reference.py DIR          (transformers + torch, fp32 CPU)
          python3 scripts/llama4_vision_reference.py DIR --pure   (the same math in plain Python,
                                                                  for a machine without torch)

The tiles are the test's: tile n, channel c, row y, column x holds
sin(0.013 * ((c * S + y) * S + x) + 0.5 * n). Prints the projected tiles
[tiles * tokens per tile, text hidden] as a Rust array (HF_EMBEDS).
"""
import json
import math
import os
import sys

import vision_reference_common as common

TILES = 3

root = sys.argv[1]
pure = "--pure" in sys.argv
cfg = json.load(open(os.path.join(root, "config.json")))
vc, tc = cfg["vision_config"], cfg["text_config"]
S, P, C = vc["image_size"], vc["patch_size"], vc.get("num_channels", 3)
D, I, L, H = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"], vc["num_attention_heads"]
THETA = vc.get("rope_theta", 10000.0)
RATIO = vc.get("pixel_shuffle_ratio", 0.5)
PI, PO = vc["projector_input_dim"], vc["projector_output_dim"]
VO = vc["vision_output_dim"]
TH = tc["hidden_size"]
EPS = 1e-5


def pixel(n, c, y, x):
    return common.pixel(S, n, c, y, x)


if not pure:
    import torch
    from importlib.metadata import version
    from safetensors.torch import load_file
    from transformers import Llama4Config
    from transformers.models.llama4.modeling_llama4 import (Llama4MultiModalProjector,
                                                            Llama4VisionModel)

    config = Llama4Config.from_pretrained(root)
    # The eager attention: `vision_eager_attention_forward`, softmax(q k^T / sqrt(head_dim)) v.
    config.vision_config._attn_implementation = "eager"
    state = {}
    for fn in sorted(os.listdir(root)):
        if fn.endswith(".safetensors"):
            state.update(load_file(os.path.join(root, fn)))
    vision = Llama4VisionModel(config.vision_config).float().eval()
    projector = Llama4MultiModalProjector(config).float().eval()
    # strict: the checkpoint's names are the classes' names.
    vision.load_state_dict({k[len("vision_model."):]: v.float() for k, v in state.items()
                            if k.startswith("vision_model.")}, strict=True)
    projector.load_state_dict({k[len("multi_modal_projector."):]: v.float() for k, v in state.items()
                               if k.startswith("multi_modal_projector.")}, strict=True)
    px = torch.tensor([[[[pixel(n, c, y, x) for x in range(S)] for y in range(S)]
                        for c in range(C)] for n in range(TILES)], dtype=torch.float32)
    with torch.no_grad():
        feats = vision(pixel_values=px).last_hidden_state
        out = projector(feats.reshape(-1, feats.shape[-1]))
    common.emit(out.reshape(-1).tolist(),
                f"transformers {version('transformers')}, torch {torch.__version__}, "
                f"Llama4VisionModel then Llama4MultiModalProjector "
                f"(attention {config.vision_config._attn_implementation}), fp32 CPU", TILES)
    sys.exit(0)


# Plain Python: the safetensors file (f16/bf16/f32), then transformers' math step by step.

W = common.load_dir(root)
V = "vision_model"


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


def gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def add(a, b):
    return [[x + y for x, y in zip(r1, r2)] for r1, r2 in zip(a, b)]


g = S // P
hd = D // H
seq = g * g + 1
# Llama4VisionRotaryEmbedding: freq_dim = hd // 2 frequencies rope_freq[j] = theta^(-2j / freq_dim)
# for j < freq_dim // 2; patch i at (x, y) = (i % g, i // g); complex pair p turns by
# (x + 1) * rope_freq[p] for p < hd // 4, by (y + 1) * rope_freq[p - hd // 4] after; the class
# token (last) by nothing.
freq_dim = hd // 2
rope_freq = [1.0 / THETA ** ((2 * j) / freq_dim) for j in range(freq_dim // 2)]
angles = []
for i in range(seq):
    row = []
    for p in range(hd // 2):
        if i == g * g:
            a = 0.0
        elif p < hd // 4:
            a = (i % g + 1) * rope_freq[p]
        else:
            a = (i // g + 1) * rope_freq[p - hd // 4]
        row.append((math.cos(a), math.sin(a)))
    angles.append(row)


def rope(x):
    out = []
    for t, r in enumerate(x):
        o = list(r)
        for h in range(H):
            for p, (c, s) in enumerate(angles[t]):
                i = h * hd + 2 * p
                a, b = r[i], r[i + 1]
                o[i], o[i + 1] = a * c - b * s, a * s + b * c
        out.append(o)
    return out


K = C * P * P
s_ = round(1 / RATIO)
m = g // s_
result = []
for n in range(TILES):
    # Unfold (im2col: channel, then kernel row, then kernel column), linear without bias.
    rows = [[pixel(n, c, gy * P + py, gx * P + px) for c in range(C) for py in range(P) for px in range(P)]
            for gy in range(g) for gx in range(g)]
    h = linear(rows, W[f"{V}.patch_embedding.linear.weight"], None, D, K)
    h.append(list(W[f"{V}.class_embedding"]))
    pos = W[f"{V}.positional_embedding_vlm"]
    h = [[v + pos[t * D + o] for o, v in enumerate(r)] for t, r in enumerate(h)]
    h = layer_norm(h, W[f"{V}.layernorm_pre.weight"], W[f"{V}.layernorm_pre.bias"])
    for l in range(L):
        p = f"{V}.model.layers.{l}"
        x = layer_norm(h, W[f"{p}.input_layernorm.weight"], W[f"{p}.input_layernorm.bias"])
        q = rope(linear(x, W[f"{p}.self_attn.q_proj.weight"], W[f"{p}.self_attn.q_proj.bias"], D, D))
        k = rope(linear(x, W[f"{p}.self_attn.k_proj.weight"], W[f"{p}.self_attn.k_proj.bias"], D, D))
        v = linear(x, W[f"{p}.self_attn.v_proj.weight"], W[f"{p}.self_attn.v_proj.bias"], D, D)
        att = [[0.0] * D for _ in range(seq)]
        for hh in range(H):
            for i in range(seq):
                sc = [sum(q[i][hh * hd + e] * k[j][hh * hd + e] for e in range(hd)) * hd ** -0.5
                      for j in range(seq)]
                mx = max(sc)
                ex = [math.exp(z - mx) for z in sc]
                zs = sum(ex)
                for e in range(hd):
                    att[i][hh * hd + e] = sum(ex[j] / zs * v[j][hh * hd + e] for j in range(seq))
        o = linear(att, W[f"{p}.self_attn.o_proj.weight"], W[f"{p}.self_attn.o_proj.bias"], D, D)
        h = add(h, o)
        x = layer_norm(h, W[f"{p}.post_attention_layernorm.weight"], W[f"{p}.post_attention_layernorm.bias"])
        x = linear(x, W[f"{p}.mlp.fc1.weight"], W[f"{p}.mlp.fc1.bias"], I, D)
        x = [[gelu(z) for z in r] for r in x]
        x = linear(x, W[f"{p}.mlp.fc2.weight"], W[f"{p}.mlp.fc2.bias"], D, I)
        h = add(h, x)
    h = layer_norm(h, W[f"{V}.layernorm_post.weight"], W[f"{V}.layernorm_post.bias"])[:-1]
    # pixel_shuffle: token (j, i) of the (g/s)² holds patch rows s*j .. s*j+s-1 and columns
    # s*i .. s*i+s-1, ordered (row offset, column offset, channel).
    shuffled = []
    for j in range(m):
        for i in range(m):
            tok = []
            for dy in range(s_):
                for dx in range(s_):
                    tok.extend(h[(s_ * j + dy) * g + s_ * i + dx])
            shuffled.append(tok)
    x = linear(shuffled, W[f"{V}.vision_adapter.mlp.fc1.weight"], None, PI, I)
    x = [[gelu(z) for z in r] for r in x]
    x = linear(x, W[f"{V}.vision_adapter.mlp.fc2.weight"], None, PO, PI)
    x = [[gelu(z) for z in r] for r in x]
    x = linear(x, W["multi_modal_projector.linear_1.weight"], None, TH, VO)
    for r in x:
        result.extend(r)
common.emit(result, "plain Python (transformers' Llama4VisionModel and Llama4MultiModalProjector math), fp64",
            TILES)
