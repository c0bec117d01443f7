"""What scripts/siglip_reference.py and scripts/pixtral_reference.py share: the test images'
pixels, the Rust array they print, and a plain-Python reader of a folder's safetensors files
(F16, BF16, F32) for their `--pure` mode."""
import json
import math
import os
import struct


def pixel(size, n, c, y, x):
    """Image n, channel c, row y, column x of the tests' images of `size` pixels a side."""
    return math.sin(0.013 * ((c * size + y) * size + x) + 0.5 * n)


def emit(values, how, images):
    print(f"// {how}: {images} images, {len(values)} values")
    print(f"const HF_EMBEDS: [f64; {len(values)}] = [")
    for i in range(0, len(values), 6):
        print("    " + ", ".join(f"{v:.8e}" for v in values[i:i + 6]) + ",")
    print("];")


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = blob[a:b]
        if t["dtype"] == "F16":
            vals = list(struct.unpack(f"<{len(raw) // 2}e", raw))
        elif t["dtype"] == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        elif t["dtype"] == "F32":
            vals = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        else:
            raise SystemExit(f"{name}: dtype {t['dtype']} not read")
        out[name] = vals
    return out


def load_dir(root):
    """Every tensor of the folder's safetensors files, as lists of floats."""
    w = {}
    for fn in sorted(os.listdir(root)):
        if fn.endswith(".safetensors"):
            w.update(load(os.path.join(root, fn)))
    return w
