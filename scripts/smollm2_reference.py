#!/usr/bin/env python3
"""Reference next-token logits for tests/model_files.rs, from llama.cpp (llama-cpp-python),
an implementation independent of vramscope. Prints the tool versions, the token ids of each
prompt and the top-5 (id, token, logit) after the last token.

Setup (outside git):  python3 -m venv /tmp/ref && /tmp/ref/bin/pip install llama-cpp-python
Run:                  /tmp/ref/bin/python scripts/smollm2_reference.py .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import sys
from importlib.metadata import version

import numpy as np
from llama_cpp import Llama

PROMPTS = ["The capital of France is", "def fibonacci(n):"]

llm = Llama(model_path=sys.argv[1], n_ctx=64, logits_all=True, n_threads=1, verbose=False)
print(f"llama-cpp-python {version('llama-cpp-python')}, numpy {np.__version__}, python {sys.version.split()[0]}")
for prompt in PROMPTS:
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
    top = np.argsort(-logits)[:5]
    print(prompt)
    print("ids", ids)
    print("top5", [(int(i), llm.detokenize([int(i)]).decode(errors="replace"), round(float(logits[i]), 4)) for i in top])
