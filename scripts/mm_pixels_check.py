#!/usr/bin/env python3
"""Reproduce the Hugging Face processor calls that vLLM makes on its
encoder-profile dummy inputs, without vLLM, without network access and
without downloading any model files.

  * vLLM 0.33.0, mistralai/Mistral-Small-3.1-24B-Instruct-2503 in HF format
    (Mistral3ForConditionalGeneration): one dummy image, PIL RGB 1540x1540,
    color=255, passed *without text* to PixtralProcessor with
    do_normalize=False, do_rescale=False, return_tensors="pt".
  * vLLM 0.28.0, Qwen/Qwen2.5-VL-7B-Instruct: the profile modality is video
    (14 frames of 3584x3584, np.uint8 filled with 255) with the dummy text
    "<|video_pad|>"; the image call (PIL RGB 3584x3584, color=255, text
    "<|image_pad|>") is also reproduced.  Both are passed to
    Qwen2_5_VLProcessor with do_normalize=False, do_rescale=False,
    truncation=False, return_tensors="pt".

For every image-processor class that exists (torchvision "fast" backend,
PIL "slow" backend, and the legacy "...Fast" alias) the script records
dtype and shape of every output, then applies vLLM's own post-processing
(floating tensors cast to the model dtype, bfloat16 here; Mistral 3's
per-image crop into a list; the batched/flat field reduction) and records
that too.  A class that does not exist is reported, not fatal.

Usage:  python3 scripts/mm_pixels_check.py OUT.json [--video-frames N] [--skip-video]
                                           [--with-normalize]
  --video-frames N   frames of the Qwen2.5-VL dummy video (default 14, the
                     number vLLM 0.28 uses with max_model_len=128000)
  --skip-video       do not run the (memory-hungry) video case
  --with-normalize   also run every call with do_normalize/do_rescale left
                     at the processor defaults (what vLLM does when
                     --mm-device-do-normalize is off); for the video this
                     needs ~2.2 GB of float32 per 14 frames
Requires: torch, torchvision (for the "fast" classes), transformers 5.x, Pillow.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch
from PIL import Image

import transformers

MODEL_DTYPE = torch.bfloat16  # torch_dtype of both checkpoints

# --- published preprocessor settings ------------------------------------
# mistralai/Mistral-Small-3.1-24B-Instruct-2503: preprocessor_config.json
# (image_processor_type PixtralImageProcessor[Fast]) and processor_config.json
# (PixtralProcessor: patch_size 14, spatial_merge_size 2, [IMG] tokens).
PIXTRAL_IMAGE_KW = dict(
    do_convert_rgb=True,
    do_normalize=True,
    do_rescale=True,
    do_resize=True,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
    patch_size={"height": 14, "width": 14},
    resample=3,  # BICUBIC
    rescale_factor=1 / 255,
    size={"longest_edge": 1540},
)
PIXTRAL_PROCESSOR_KW = dict(
    patch_size=14,
    spatial_merge_size=2,
    image_token="[IMG]",
    image_break_token="[IMG_BREAK]",
    image_end_token="[IMG_END]",
)
MISTRAL3_DUMMY_SIZE = 1540  # Mistral3ProcessingInfo: size["longest_edge"]
MISTRAL3_TOKENS_PER_IMAGE = 55 * 55  # ceil(1540/28)^2, encoder-budget units

# Qwen/Qwen2.5-VL-7B-Instruct: preprocessor_config.json (image and video).
QWEN_VISION_KW = dict(
    do_convert_rgb=True,
    do_normalize=True,
    do_rescale=True,
    do_resize=True,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
    min_pixels=3136,
    max_pixels=12845056,
    patch_size=14,
    temporal_patch_size=2,
    merge_size=2,
    resample=3,
    rescale_factor=1 / 255,
)
QWEN_DUMMY_SIZE = 3584  # get_image_size_with_most_features: 28 * 128


def describe(x: Any) -> Any:
    """dtype/shape of tensors and arrays, recursively; short for the rest."""
    if isinstance(x, torch.Tensor):
        return {"type": "torch.Tensor", "dtype": str(x.dtype).replace("torch.", ""),
                "shape": list(x.shape)}
    if isinstance(x, np.ndarray):
        return {"type": "np.ndarray", "dtype": str(x.dtype), "shape": list(x.shape)}
    if isinstance(x, (list, tuple)):
        items = [describe(v) for v in x]
        if items and all(i == items[0] for i in items):
            return {"type": type(x).__name__, "len": len(items), "each": items[0]}
        return {"type": type(x).__name__, "len": len(items), "items": items[:8]}
    if isinstance(x, dict):
        return {k: describe(v) for k, v in x.items()}
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return {"type": type(x).__name__, "repr": repr(x)[:200]}


def value_range(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.numel() and x.dtype != torch.bool:
        t = x.float() if not x.is_floating_point() else x.float()
        return {"min": float(t.min()), "max": float(t.max())}
    return None


def vllm_cast(x: Any) -> Any:
    """InputProcessingContext._postprocess_output (0.28 context.py:237-252,
    0.33 context.py:357-372): floating tensors -> model dtype, others kept."""
    if isinstance(x, torch.Tensor):
        return x.to(MODEL_DTYPE) if x.is_floating_point() else x
    if isinstance(x, list):
        return [vllm_cast(v) for v in x]
    if isinstance(x, dict):
        return {k: vllm_cast(v) for k, v in x.items()}
    return x


def batched_reduce(elems: list[torch.Tensor]) -> Any:
    """MultiModalBatchedField._reduce_data (0.33 inputs.py:519-536)."""
    if elems and all(isinstance(e, torch.Tensor) for e in elems):
        if len(elems) == 1:
            return elems[0].unsqueeze(0)
        if all(e.shape == elems[0].shape for e in elems):
            return torch.stack(elems)
    return elems


def get_cls(name: str):
    """Return (class, note) or (None, reason) without raising."""
    try:
        mod = transformers
        cls = getattr(mod, name)
        # transformers' lazy module may hand back a dummy object when a backend
        # (torchvision) is missing; instantiate-time errors are caught later.
        real = getattr(cls, "__name__", name)
        note = None if real == name else f"alias of {real}"
        return cls, note
    except Exception as exc:  # AttributeError, ImportError, ...
        return None, f"{type(exc).__name__}: {exc}"


def make_tokenizer(special: list[str]):
    """A tiny in-memory tokenizer that knows the processor's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for tok in special:
        vocab.setdefault(tok, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(special)
    cls = getattr(transformers, "PreTrainedTokenizerFast", None) or getattr(
        transformers, "TokenizersBackend"
    )
    return cls(tokenizer_object=tk, unk_token="[UNK]", additional_special_tokens=special)


def run_call(label: str, fn) -> dict:
    rec: dict[str, Any] = {"call": label}
    t0 = time.time()
    try:
        out = fn()
        rec["status"] = "ok"
        data = dict(out.data) if hasattr(out, "data") else dict(out)
        rec["hf_output"] = {k: describe(v) for k, v in data.items()}
        rec["hf_output_range"] = {
            k: r for k, v in data.items() if (r := value_range(v)) is not None
        }
        rec["_data"] = data
    except Exception as exc:
        rec["status"] = "error"
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc().splitlines()[-6:]
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def mistral3_case(args) -> dict:
    res: dict[str, Any] = {
        "vllm": "0.33.0",
        "model": "mistralai/Mistral-Small-3.1-24B-Instruct-2503 (HF format, "
                 "Mistral3ForConditionalGeneration)",
        "dummy_input": "PIL.Image.new('RGB', (1540, 1540), color=255) -> every pixel "
                       "(255, 0, 0); one image per processor call",
        "processor_kwargs": PIXTRAL_PROCESSOR_KW,
        "image_processor_kwargs": PIXTRAL_IMAGE_KW,
        "classes": {},
    }
    PixtralProcessor = getattr(transformers, "PixtralProcessor", None)
    if PixtralProcessor is None:
        res["error"] = "transformers has no PixtralProcessor"
        return res
    tok = make_tokenizer(["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    img = Image.new("RGB", (MISTRAL3_DUMMY_SIZE, MISTRAL3_DUMMY_SIZE), color=255)
    res["dummy_pixel_0_0"] = list(img.getpixel((0, 0)))

    for backend, name in (("torchvision (fast, default in transformers 5)",
                           "PixtralImageProcessor"),
                          ("legacy Fast alias", "PixtralImageProcessorFast"),
                          ("PIL (slow)", "PixtralImageProcessorPil")):
        cls, note = get_cls(name)
        entry: dict[str, Any] = {"backend": backend}
        if cls is None:
            entry["status"] = "missing"
            entry["reason"] = note
            res["classes"][name] = entry
            continue
        if note:
            entry["note"] = note
        try:
            ip = cls(**PIXTRAL_IMAGE_KW)
            proc = PixtralProcessor(image_processor=ip, tokenizer=tok, **PIXTRAL_PROCESSOR_KW)
            entry["instantiated"] = type(ip).__name__
        except Exception as exc:
            entry["status"] = "error"
            entry["error"] = f"{type(exc).__name__}: {exc}"
            res["classes"][name] = entry
            continue

        calls = [(
            "processor(images=[img], do_normalize=False, do_rescale=False, "
            "return_tensors='pt')  # vLLM 0.33 default (mm_device_do_normalize on)",
            lambda: proc(images=[img], do_normalize=False, do_rescale=False,
                         return_tensors="pt"),
        )]
        if args.with_normalize:
            calls.append((
                "processor(images=[img], return_tensors='pt')  "
                "# --no-mm-device-do-normalize",
                lambda: proc(images=[img], return_tensors="pt"),
            ))
        entry["calls"] = []
        for label, fn in calls:
            rec = run_call(label, fn)
            data = rec.pop("_data", None)
            if data is not None:
                # vLLM: cast floats, then Mistral3MultiModalProcessor.
                # _postprocess_hf_mm_data crops each image to image_sizes and
                # keeps a list; only pixel_values survives _get_mm_fields_config.
                data = vllm_cast(data)
                pv, sizes = data["pixel_values"], data["image_sizes"]
                per_image = [p[:, :h, :w] for p, (h, w) in zip(pv, sizes)]
                rec["vllm_after_postprocess"] = {"pixel_values": describe(per_image)}
                n = max(1, 8192 // MISTRAL3_TOKENS_PER_IMAGE)
                stacked = batched_reduce([per_image[0]] * n)
                rec["vllm_model_input_profile"] = {
                    "note": f"{n} copies (encoder budget 8192 = serve default "
                            "max_num_batched_tokens on H100/H200, // 3025 tokens)",
                    "pixel_values": describe(stacked),
                }
            entry["calls"].append(rec)
        entry["status"] = "ok" if all(c["status"] == "ok" for c in entry["calls"]) else "error"
        res["classes"][name] = entry
    return res


def qwen25vl_case(args) -> dict:
    res: dict[str, Any] = {
        "vllm": "0.28.0",
        "model": "Qwen/Qwen2.5-VL-7B-Instruct",
        "dummy_image": "PIL.Image.new('RGB', (3584, 3584), color=255) -> (255, 0, 0)",
        "dummy_video": f"np.full(({args.video_frames}, 3584, 3584, 3), 255, np.uint8)",
        "vision_kwargs": QWEN_VISION_KW,
        "classes": {},
    }
    Proc = getattr(transformers, "Qwen2_5_VLProcessor", None)
    if Proc is None:
        res["error"] = "transformers has no Qwen2_5_VLProcessor"
        return res
    tok = make_tokenizer(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                          "<|video_pad|>"])
    vid_cls, vid_note = get_cls("Qwen2VLVideoProcessor")
    video_proc = None
    if vid_cls is None:
        res["video_processor"] = {"status": "missing", "reason": vid_note}
    else:
        try:
            video_proc = vid_cls(**QWEN_VISION_KW)
            res["video_processor"] = {"status": "ok", "class": type(video_proc).__name__,
                                      "size": dict(video_proc.size)}
        except Exception as exc:
            res["video_processor"] = {"status": "error",
                                      "error": f"{type(exc).__name__}: {exc}"}

    img = Image.new("RGB", (QWEN_DUMMY_SIZE, QWEN_DUMMY_SIZE), color=255)
    video = None
    if not args.skip_video:
        video = np.full((args.video_frames, QWEN_DUMMY_SIZE, QWEN_DUMMY_SIZE, 3), 255,
                        dtype=np.uint8)

    vllm_kw = dict(do_normalize=False, do_rescale=False, truncation=False,
                   return_tensors="pt")
    for backend, name in (("torchvision (fast; vLLM passes use_fast=True)",
                           "Qwen2VLImageProcessor"),
                          ("legacy Fast alias", "Qwen2VLImageProcessorFast"),
                          ("PIL (slow)", "Qwen2VLImageProcessorPil")):
        cls, note = get_cls(name)
        entry: dict[str, Any] = {"backend": backend}
        if cls is None:
            entry["status"] = "missing"
            entry["reason"] = note
            res["classes"][name] = entry
            continue
        if note:
            entry["note"] = note
        try:
            ip = cls(**QWEN_VISION_KW)
            kw = {"image_processor": ip, "tokenizer": tok}
            if video_proc is not None:
                kw["video_processor"] = video_proc
            proc = Proc(**kw)
            entry["instantiated"] = type(ip).__name__
            entry["image_size_setting"] = dict(ip.size)
        except Exception as exc:
            entry["status"] = "error"
            entry["error"] = f"{type(exc).__name__}: {exc}"
            res["classes"][name] = entry
            continue

        calls = [(
            "processor(text='<|image_pad|>', images=[img], do_normalize=False, "
            "do_rescale=False, truncation=False, return_tensors='pt')",
            lambda: proc(text="<|image_pad|>", images=[img], **vllm_kw),
        )]
        if args.with_normalize:
            calls.append((
                "processor(text='<|image_pad|>', images=[img], truncation=False, "
                "return_tensors='pt')  # --no-mm-device-do-normalize",
                lambda: proc(text="<|image_pad|>", images=[img], truncation=False,
                             return_tensors="pt"),
            ))
        # The video processor does not depend on the image-processor class:
        # run it once, with the first class that instantiates.
        if video is not None and video_proc is not None and "video_done" not in res:
            res["video_done"] = name
            calls.append((
                "processor(text='<|video_pad|>', videos=[video], do_normalize=False, "
                "do_rescale=False, truncation=False, return_tensors='pt')  "
                "# the profile modality in 0.28",
                lambda: proc(text="<|video_pad|>", videos=[video], **vllm_kw),
            ))
            if args.with_normalize:
                calls.append((
                    "processor(text='<|video_pad|>', videos=[video], truncation=False, "
                    "return_tensors='pt')  # --no-mm-device-do-normalize",
                    lambda: proc(text="<|video_pad|>", videos=[video], truncation=False,
                                 return_tensors="pt"),
                ))
        entry["calls"] = []
        for label, fn in calls:
            rec = run_call(label, fn)
            data = rec.pop("_data", None)
            if data is not None:
                data = vllm_cast(data)
                keep = ("pixel_values", "image_grid_thw", "pixel_values_videos",
                        "video_grid_thw", "second_per_grid_ts")
                rec["vllm_after_postprocess"] = {
                    k: describe(v) for k, v in data.items() if k in keep
                }
                rec["note"] = ("pixel_values / pixel_values_videos are flat fields "
                               "(rows = grid_t*grid_h*grid_w per item) and reach the "
                               "model concatenated along dim 0; *_grid_thw are "
                               "batched fields stacked to [num_items, 3]")
            entry["calls"].append(rec)
        entry["status"] = "ok" if all(c["status"] == "ok" for c in entry["calls"]) else "error"
        res["classes"][name] = entry
    res.pop("video_done", None)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--video-frames", type=int, default=14)
    ap.add_argument("--skip-video", action="store_true")
    ap.add_argument("--with-normalize", action="store_true")
    args = ap.parse_args()

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    for mod in ("torchvision", "PIL"):
        try:
            env[mod] = importlib.import_module(mod).__version__
        except Exception as exc:
            env[mod] = f"missing ({type(exc).__name__})"
    result = {"env": env}
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for key, fn in (("mistral3_vllm_0.33", mistral3_case),
                    ("qwen2_5_vl_vllm_0.28", qwen25vl_case)):
        try:
            result[key] = fn(args)
        except Exception as exc:
            result[key] = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc().splitlines()[-8:]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
