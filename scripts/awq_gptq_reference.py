#!/usr/bin/env python3
"""Dequantizes every AWQ or GPTQ linear of a checkpoint as the formats' own code does, in pure
Python 3 (no torch, no numpy), and prints one digest per weight, for tests/awq_gptq.rs to
compare with vramscope's dequantized weights bit for bit.

AWQ (AutoAWQ GEMM, awq/utils/packing_utils.py `unpack_awq`, `reverse_awq_order`,
`dequantize_gemm`): each int32 of `qweight [in, out/8]` and `qzeros [groups, out/8]` is split
into nibbles by shifts 0, 4, ..., 28; the nibbles are reordered with AWQ_REVERSE_ORDER
[0, 4, 1, 5, 2, 6, 3, 7]; scales and zeros repeat over `group_size` inputs;
`w = (iweight - izeros) * scales`, in float16.

GPTQ (AutoGPTQ `QuantLinear`, auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py forward and
qlinear_exllama's act-order path): `qweight [in/8, out]`, input row 8r + j in bits 4j;
`qzeros [groups, out/8]` in bits 4j, stored minus one (`zeros + 1`, v1 format);
`w = scales[g_idx] * (weight - zeros[g_idx])`, in float16. `g_idx` is read from the file.

The float16 product: (q - z) is a small integer and the scale a float16, so their product is
exact in a Python float; `struct.pack('<e')` rounds it to float16 (to nearest, ties to even),
as PyTorch's float16 multiply does.

Digest per weight: FNV-1a 64 over its float16 bytes (little endian), laid out [out, in]
(PyTorch's nn.Linear weight), row by row.

Run: python3 scripts/awq_gptq_reference.py DIR
"""
import json, struct, sys

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main(root):
    cfg = json.load(open(f"{root}/config.json"))
    q = cfg["quantization_config"]
    method, gs = q["quant_method"], q["group_size"]
    raw = open(f"{root}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    body = raw[8 + n:]

    def tensor(name, dtype, fmt):
        m = hdr[name]
        assert m["dtype"] == dtype, (name, m["dtype"])
        a, b = m["data_offsets"]
        count = (b - a) // struct.calcsize(fmt)
        return m["shape"], struct.unpack(f"<{count}{fmt}", body[a:b])

    bases = sorted(k[: -len(".qweight")] for k in hdr if k.endswith(".qweight"))
    for base in bases:
        (rows, cols), qw = tensor(base + ".qweight", "I32", "i")
        _, qz = tensor(base + ".qzeros", "I32", "i")
        (groups, out), sc = tensor(base + ".scales", "F16", "e")
        if method == "awq":
            k = rows
            g = k if gs == -1 else gs

            def unpack(words, r, c8):
                # iweights[:, 8j + i] = nibble i of word j; then columns reordered.
                out_row = []
                for j in range(c8):
                    w = words[r * c8 + j] & 0xFFFFFFFF
                    nib = [(w >> s) & 0xF for s in range(0, 32, 4)]
                    out_row.extend(nib[AWQ_REVERSE_ORDER[i]] for i in range(8))
                return out_row

            wt = [[0.0] * k for _ in range(out)]
            zrows = [unpack(qz, gi, cols) for gi in range(groups)]
            for i in range(k):
                qrow = unpack(qw, i, cols)
                gi = i // g
                for c in range(out):
                    v = (qrow[c] - zrows[gi][c]) * sc[gi * out + c]
                    wt[c][i] = v
        else:
            k = rows * 8
            _, g_idx = tensor(base + ".g_idx", "I32", "i")
            zeros = []
            for gi in range(groups):
                zr = []
                for j in range(out // 8):
                    w = qz[gi * (out // 8) + j] & 0xFFFFFFFF
                    zr.extend((((w >> (4 * b)) & 0xF) + 1) & 0xF for b in range(8))
                zeros.append(zr)
            wt = [[0.0] * k for _ in range(out)]
            for r in range(rows):
                for c in range(out):
                    w = qw[r * out + c] & 0xFFFFFFFF
                    for j in range(8):
                        i = 8 * r + j
                        gi = g_idx[i]
                        wt[c][i] = sc[gi * out + c] * (((w >> (4 * j)) & 0xF) - zeros[gi][c])
        data = b"".join(struct.pack(f"<{k}e", *row) for row in wt)
        print(f'("{base}", 0x{fnv1a(data):016x}),')


if __name__ == "__main__":
    main(sys.argv[1])
