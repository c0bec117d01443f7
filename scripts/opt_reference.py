#!/usr/bin/env python3
"""Reference logits and 4-bit dequantizations for tests/opt_reference.rs and
tests/bnb4_files.rs, from implementations independent of vramscope:

1. Hugging Face `OPTForCausalLM` in PyTorch fp32 on the two small OPT checkpoints the test
   writes with gen-model (seeded synthetic weights, f16 safetensors): one pre-LN model shaped
   like opt-125m and one post-LN model with project_in/out shaped like opt-350m. Each sequence
   runs on its own (no padding), so HF's positions are 0..n-1 as in vramscope's batch.
   Prints, per model and sequence, the logits of the last token at ids 3, 19, 35, ... (every
   16th id below 1000).
2. bitsandbytes' own `dequantize_4bit` (CPU) on the 4-bit checkpoints the test writes
   (NF4 and FP4, with and without double quantization), each weight's QuantState built by
   `QuantState.from_dict` from the stored tensors as vLLM's loader builds it. Prints, per
   checkpoint, the sum and sum of squares (f64) of one dequantized weight and eight values.

Setup (outside git):
  python3 -m venv /tmp/optref && /tmp/optref/bin/pip install torch transformers safetensors bitsandbytes
Fixtures:  VRAMSCOPE_OPT_FIXTURES=/tmp/optfix cargo test --test opt_reference -- --ignored write_fixtures
Run:       /tmp/optref/bin/python scripts/opt_reference.py /tmp/optfix
"""
import os
import sys
from importlib.metadata import version

import torch
from safetensors.torch import load_file
from transformers import OPTForCausalLM

root = sys.argv[1]
torch.manual_seed(0)
print(f"torch {torch.__version__}, transformers {version('transformers')}, "
      f"bitsandbytes {version('bitsandbytes')}, python {sys.version.split()[0]}")

# The batch of tests/opt_reference.rs: two sequences.
SEQS = [[5, 17, 900, 3, 42], [999, 0, 64]]
IDS = list(range(3, 1000, 16))

for name in ["pre_ln", "post_ln"]:
    model = OPTForCausalLM.from_pretrained(os.path.join(root, name), dtype=torch.float32)
    model.eval()
    print(f"{name}:")
    with torch.no_grad():
        for s in SEQS:
            out = model(torch.tensor([s])).logits[0, -1]
            print("  [" + ", ".join(f"{out[i].item():.6e}" for i in IDS) + "],")

import bitsandbytes.functional as F  # noqa: E402

WEIGHT = "model.decoder.layers.1.fc1.weight"
for name in ["nf4_dq", "nf4", "fp4_dq", "fp4"]:
    st = load_file(os.path.join(root, name, "model.safetensors"))
    qs = F.QuantState.from_dict({k: v for k, v in st.items() if k.startswith(WEIGHT + ".")}, device="cpu")
    w = F.dequantize_4bit(st[WEIGHT], qs).double().flatten()
    picks = [0, 1, 63, 64, 1000, 4095, 4096, w.numel() - 1]
    # repr: the shortest digits that read back as the same double (the f16 value exactly).
    print(f"{name}: dtype {qs.dtype} sum {w.sum().item()!r} sumsq {(w * w).sum().item()!r}")
    print("  values [" + ", ".join(repr(w[i].item()) for i in picks) + "]")
