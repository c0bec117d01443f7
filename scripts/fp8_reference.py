#!/usr/bin/env python3
"""PyTorch's float8_e4m3fn conversion (c10's fp8e4m3fn_from_fp32_value, what vLLM's
`scaled_fp8_quant` ends in) run on every float16 value, and its decoding of every code; prints
FNV-1a 64 digests of the codes and of the decoded values' f32 bits, which
`quant::fp8::tests::encode_and_decode_equal_pytorchs_on_every_f16_and_every_code` holds.

Run: python3 scripts/fp8_reference.py   (needs torch; no GPU)
"""
import struct
import torch

def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

halves = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
codes = halves.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)
code_bytes = bytes(codes.tolist())
decoded = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
# NaN codes (0x7F, 0xFF) decode to NaN; their payload is not part of the format.
dec_bits = b"".join(
    struct.pack("<I", 0x7FC00000 if v != v else struct.unpack("<I", struct.pack("<f", v))[0])
    for v in decoded.tolist()
)
print("torch", torch.__version__)
print("codes of the 65536 f16 values: fnv1a64 0x%016x" % fnv1a64(code_bytes))
print("f32 bits of the 256 decoded codes: fnv1a64 0x%016x" % fnv1a64(dec_bits))
print("sample codes:", [code_bytes[i] for i in (0x0000, 0x0001, 0x1c00, 0x3c00, 0x5f00, 0x5f80, 0x7bff, 0x7c00, 0x7e00, 0xbc00)])
