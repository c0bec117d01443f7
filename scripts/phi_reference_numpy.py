#!/usr/bin/env python3
"""An independent Phi (phi-1_5 / phi-2 layout) forward in numpy (fp64, no torch), written line
by line from Hugging Face transformers 4.57.0's models/phi/modeling_phi.py (PhiForCausalLM,
eager attention), for checking the Rust CPU path where transformers is not installed. The
stored reference of tests/hf_reference.rs comes from this script until scripts/hf_reference.py
(transformers itself) confirms it on the GPU machine.

What it follows from modeling_phi.py:
- PhiModel.forward: embed_tokens, no scaling; each PhiDecoderLayer; final_layernorm.
- PhiDecoderLayer.forward: residual = x; h = input_layernorm(x);
  attn_outputs + mlp(h) + residual.
- PhiAttention.forward: q/k/v_proj with bias; rotary on the first
  rotary_ndims = int(head_dim * partial_rotary_factor) dims of each head (rotate_half on that
  slice, the rest passed through); softmax(q k^T * head_dim^-0.5 + causal mask) v; dense with bias.
- PhiRotaryEmbedding (default rope): inv_freq = 1 / base^(arange(0, dim, 2) / dim), dim =
  rotary_ndims; emb = cat(freqs, freqs).
- PhiMLP: fc1 -> gelu_new (NewGELUActivation, tanh approximation) -> fc2.
- lm_head: nn.Linear with bias.

Reads the fixtures `write_fixtures` writes (f16 safetensors, config.json as vramscope writes it)
and prints the last token's logits at ids 3, 19, ..., 1011 of the 6- and 5-token sequences as a
Rust array, in hf_reference.py's layout.

Run: python3 scripts/phi_reference_numpy.py DIR   (DIR/phi from
     VRAMSCOPE_HF_FIXTURES=DIR cargo test --test hf_reference -- --ignored write_fixtures)
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

root = sys.argv[1]
cfg = json.load(open(f"{root}/phi/config.json"))
W = {k: v.astype(np.float64) for k, v in load_file(f"{root}/phi/model.safetensors").items()}
H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
nh = cfg["num_attention_heads"]
hd = H // nh
rot = int(hd * cfg["partial_rotary_factor"])
eps = cfg["layer_norm_eps"]
theta = cfg["rope_theta"]


def layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * W[p + ".weight"] + W[p + ".bias"]


def linear(x, p):
    return x @ W[p + ".weight"].T + W[p + ".bias"]


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate((-x[..., h:], x[..., :h]), -1)


def forward(ids):
    n = len(ids)
    inv_freq = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    freqs = np.outer(np.arange(n, dtype=np.float64), inv_freq)
    emb = np.concatenate((freqs, freqs), -1)
    cos, sin = np.cos(emb)[None], np.sin(emb)[None]  # [1, n, rot]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = f"model.layers.{l}"
        residual = x
        h = layer_norm(x, p + ".input_layernorm")
        heads = lambda t: t.reshape(n, nh, hd).transpose(1, 0, 2)  # [nh, n, hd]
        q = heads(linear(h, p + ".self_attn.q_proj"))
        k = heads(linear(h, p + ".self_attn.k_proj"))
        v = heads(linear(h, p + ".self_attn.v_proj"))
        q_rot, q_pass = q[..., :rot], q[..., rot:]
        k_rot, k_pass = k[..., :rot], k[..., rot:]
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = k_rot * cos + rotate_half(k_rot) * sin
        q = np.concatenate((q_rot, q_pass), -1)
        k = np.concatenate((k_rot, k_pass), -1)
        s = q @ k.transpose(0, 2, 1) * hd ** -0.5 + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, H)
        attn_out = linear(a, p + ".self_attn.dense")
        ff = linear(gelu_new(linear(h, p + ".mlp.fc1")), p + ".mlp.fc2")
        x = attn_out + ff + residual
    x = layer_norm(x, "model.final_layernorm")
    return linear(x, "lm_head")


TOKENS, SEQS, VOCAB = 11, 2, 1024
base = TOKENS // SEQS
lens = [base + (1 if i < TOKENS % SEQS else 0) for i in range(SEQS)]
ids = [(i * 7919 + 13) % VOCAB for i in range(TOKENS)]
PICK = list(range(3, VOCAB, 16))
print(f"// numpy {np.__version__}, fp64: scripts/phi_reference_numpy.py (modeling_phi.py of transformers 4.57.0)")
print("const HF_PHI: [[f64; 64]; 2] = [")
start = 0
for n in lens:
    out = forward(ids[start:start + n])[-1]
    print("    [" + ", ".join(f"{out[i]:.8e}" for i in PICK) + "],")
    start += n
print("];")
