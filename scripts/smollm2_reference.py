#!/usr/bin/env python3
"""Reference next-token logits for tests/model_files.rs, from llama.cpp (llama-cpp-python),
an implementation independent of vramscope.

Two references: (1) the Q4_1 file as llama.cpp runs it (its Q4_1 dot products quantize the
activations to Q8_1, so logits differ from a float forward by a few tenths); (2) the same
weights dequantized to F32 by llama.cpp's own quantize tool (`llama_model_quantize`,
ftype ALL_F32, allow_requantize), run in f32: the dequantized model vramscope loads.
Prints the tool versions, each prompt's token ids and the top-5 (id, token, logit).

Setup (outside git):  python3 -m venv /tmp/ref && /tmp/ref/bin/pip install llama-cpp-python
Run:  /tmp/ref/bin/python scripts/smollm2_reference.py .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import os
import sys
import tempfile
from importlib.metadata import version

import llama_cpp
import numpy as np
from llama_cpp import Llama

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def top5(path):
    llm = Llama(model_path=path, n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
        top = np.argsort(-logits)[:5]
        print(f"  {prompt!r} ids {ids}")
        print("  top5", [(int(i), llm.detokenize([int(i)]).decode(errors="replace"), round(float(logits[i]), 4)) for i in top])


print(f"llama-cpp-python {version('llama-cpp-python')}, numpy {np.__version__}, python {sys.version.split()[0]}")
print("Q4_1 file as llama.cpp runs it:")
top5(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    f32 = os.path.join(d, "f32.gguf")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 0  # LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.nthread = 1
    assert llama_cpp.llama_model_quantize(sys.argv[1].encode(), f32.encode(), p) == 0
    print("dequantized to F32 by llama_model_quantize, run in f32:")
    top5(f32)
