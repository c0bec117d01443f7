"""Parameter counts of a config.json as transformers' own classes build it (meta device).

A checkpoint saved by transformers holds its model's state dict less the tied copies; the
count below is that state dict's, so it stands in for a published index's total_size where
the index cannot be read. Kimi-VL has no transformers class: its language model is counted
as `DeepseekV3ForCausalLM` from `text_config`, and its tower is left to the caller.
Usage:
    python3 scripts/param_count.py OUT.json DIR [DIR ...]
(each DIR holds a config.json; `VRAMSCOPE_PRESET_CONFIGS=DIR cargo test --lib -- --ignored
write_multimodal_preset_configs` writes them for the multimodal presets).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig


def count(model):
    """Tensors a save would write: parameters once each, plus persistent buffers."""
    params = dict(model.named_parameters())  # shared (tied) parameters once
    all_param_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    by_prefix, by_dtype, total = {}, {}, 0
    items = list(params.items())
    for name, t in model.state_dict().items():
        if name not in all_param_names:
            items.append((name, t))  # a persistent buffer
    for name, t in items:
        n = t.numel()
        total += n
        head = ".".join(name.split(".")[:2])
        by_prefix[head] = by_prefix.get(head, 0) + n
        dt = str(t.dtype).replace("torch.", "")
        by_dtype[dt] = by_dtype.get(dt, 0) + n * t.element_size()
    return {"params": total, "bytes_by_dtype": by_dtype,
            "bytes": sum(by_dtype.values()), "by_prefix": by_prefix}


def build(cls, cfg):
    with torch.device("meta"):
        return cls._from_config(cfg, torch_dtype=torch.bfloat16)


def one(d):
    raw = json.load(open(os.path.join(d, "config.json")))
    out = {"dir": os.path.basename(d.rstrip("/")), "architectures": raw.get("architectures")}
    if raw.get("model_type") == "kimi_vl":
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
        tc = dict(raw["text_config"])
        tc.pop("model_type", None)
        cfg = DeepseekV3Config(**tc)
        out["language_model"] = count(build(DeepseekV3ForCausalLM, cfg))
        # MoonViT's tensors have SigLIP's shapes one for one (a biased 14 x 14 patch
        # convolution, a 64 x 64 position grid = 4096 positions, LayerNorms with biases, fused
        # q/k/v = SigLIP's three, a biased MLP, a final LayerNorm = post_layernorm, no head):
        # counted as transformers' SiglipVisionModel at 896 pixels.
        from transformers import SiglipVisionConfig, SiglipVisionModel
        vc = raw["vision_config"]
        grid = vc["init_pos_emb_height"]
        sc = SiglipVisionConfig(hidden_size=vc["hidden_size"],
                                intermediate_size=vc["intermediate_size"],
                                num_hidden_layers=vc["num_hidden_layers"],
                                num_attention_heads=vc["num_attention_heads"],
                                patch_size=vc["patch_size"], image_size=grid * vc["patch_size"],
                                vision_use_head=False)
        out["tower_as_siglip"] = count(build(SiglipVisionModel, sc))
        out["note"] = ("language model as DeepseekV3ForCausalLM, MoonViT as SiglipVisionModel "
                       "of the same shapes; the projector by hand")
        return out
    cfg = AutoConfig.from_pretrained(d)
    arch = raw["architectures"][0]
    cls = getattr(transformers, arch)
    out["model"] = count(build(cls, cfg))
    return out


def main():
    res = {"torch": torch.__version__, "transformers": transformers.__version__, "models": []}
    for d in sys.argv[2:]:
        try:
            res["models"].append(one(d))
        except Exception as e:  # one line per config, the others still counted
            res["models"].append({"dir": d, "error": f"{type(e).__name__}: {e}"})
    json.dump(res, open(sys.argv[1], "w"), indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
