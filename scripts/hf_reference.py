#!/usr/bin/env python3
"""Reference logits for tests/hf_reference.rs: Hugging Face transformers' own model classes
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM for model_type gemma3_text, MixtralForCausalLM, Qwen3MoeForCausalLM,
Qwen2MoeForCausalLM, GemmaForCausalLM, GraniteForCausalLM, PhiForCausalLM, DeepseekV2ForCausalLM,
DeepseekV3ForCausalLM, GptOssForCausalLM, Llama4ForCausalLM, Qwen3NextForCausalLM (its torch
fallbacks for the causal conv and the chunked delta rule), picked by the config's architectures)
in PyTorch fp32 on the CPU, on the small checkpoints the test writes with gen-model (seeded
synthetic weights, f16 safetensors, config.json as vramscope writes it).

The batch is vramscope's `Batch::dummy(11, 2, 1024)`: ids (i*7919 + 13) % 1024, sequences of
6 and 5 tokens, each run on its own (no padding, positions 0..n-1). Prints, per model and
sequence, the last token's logits at ids 3, 19, ..., 1011 (every 16th) as Rust arrays.

Fixtures:  VRAMSCOPE_HF_FIXTURES=DIR cargo test --test hf_reference -- --ignored write_fixtures
Run:       python3 scripts/hf_reference.py DIR [NAMES, comma-separated]  (the GPU machine has torch and transformers)
Gemma:     python3 scripts/hf_reference.py DIR gemma2,gemma3  (prints, as comments, how transformers read
           the window, soft-caps and rotary bases, so a silently ignored key shows)
"""
import os
import sys
from importlib.metadata import version

import torch
from transformers import AutoModelForCausalLM

root = sys.argv[1]
print(f"// torch {torch.__version__}, transformers {version('transformers')}, "
      f"python {sys.version.split()[0]}")
TOKENS, SEQS, VOCAB = 11, 2, 1024
base = TOKENS // SEQS
lens = [base + (1 if i < TOKENS % SEQS else 0) for i in range(SEQS)]
ids = [(i * 7919 + 13) % VOCAB for i in range(TOKENS)]
PICK = list(range(3, VOCAB, 16))
for name in sys.argv[2].split(",") if len(sys.argv) > 2 else ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen3_moe", "qwen2_moe", "gemma", "granite", "phi"]:
    model = AutoModelForCausalLM.from_pretrained(os.path.join(root, name), dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    print(f"// {name}: {type(model).__name__}")
    c = model.config
    if c.model_type.startswith("gemma"):
        keys = ["sliding_window", "layer_types", "query_pre_attn_scalar", "attn_logit_softcapping",
                "final_logit_softcapping", "rope_theta", "rope_local_base_freq", "rope_scaling",
                "rope_parameters"]
        print("// " + ", ".join(f"{k}={getattr(c, k, None)!r}" for k in keys))
    if c.model_type == "granite":
        keys = ["embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
                "tie_word_embeddings", "rope_theta"]
        print("// " + ", ".join(f"{k}={getattr(c, k, None)!r}" for k in keys))
    if c.model_type == "gemma":
        keys = ["head_dim", "num_key_value_heads", "hidden_act", "hidden_activation"]
        print("// " + ", ".join(f"{k}={getattr(c, k, None)!r}" for k in keys))
    if c.model_type == "qwen3_next":
        keys = ["layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "head_dim", "rope_parameters"]
        print("// " + ", ".join(f"{k}={getattr(c, k, None)!r}" for k in keys))
    moe = c.model_type in ("mixtral", "qwen3_moe", "qwen2_moe", "qwen3_next")
    if moe:
        keys = ["num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                "shared_expert_intermediate_size", "qkv_bias"]
        print("// " + ", ".join(f"{k}={getattr(c, k, None)!r}" for k in keys))
    print(f"const HF_{name.upper()}: [[f64; 64]; 2] = [")
    start = 0
    with torch.no_grad():
        for n in lens:
            x = torch.tensor([ids[start:start + n]])
            res = model(x, output_router_logits=True) if moe else model(x)
            out = res.logits[0, -1]
            print("    [" + ", ".join(f"{out[i].item():.8e}" for i in PICK) + "],")
            if moe:
                # How far each token's k-th expert is from its (k+1)-th (softmax probability):
                # a routing an f16 forward could flip would show a gap near 1e-3.
                k = c.num_experts_per_tok
                gaps = []
                for layer_logits in res.router_logits:
                    if layer_logits is None:
                        continue
                    p = torch.softmax(layer_logits.float(), dim=-1).sort(dim=-1, descending=True).values
                    gaps.append((p[:, k - 1] - p[:, k]).min().item())
                print(f"    // smallest k-th to (k+1)-th routing gap per MoE layer: {gaps}")
            start += n
    print("];")
