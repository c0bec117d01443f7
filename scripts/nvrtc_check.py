#!/usr/bin/env python3
"""Compiles the CUDA kernel sources (kernels.rs SOURCE + sampler.rs SOURCE + kernels.rs
OPT_BNB_SOURCE + fp8.rs SOURCE, concatenated as compile_kernels does) with NVRTC, without a GPU, and checks the
OPT/4-bit entry points are in the PTX. NVRTC comes from the pip wheel `nvidia-cuda-nvrtc`
(pulled in by `pip install torch`).

Run: python3 scripts/nvrtc_check.py . [path/to/libnvrtc.so]
"""
import ctypes, re, sys
lib = ctypes.CDLL(sys.argv[2] if len(sys.argv) > 2 else "/tmp/optref/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13")
def raw(path, name):
    s = open(path).read()
    m = re.search(r'(?:pub\((?:crate|super)\) )?const %s: &str = r#"(.*?)"#;' % name, s, re.S)
    return m.group(1)
src = raw(sys.argv[1] + "/src/device/cuda/kernels.rs", "SOURCE") + raw(sys.argv[1] + "/src/device/cuda/sampler.rs", "SOURCE") + raw(sys.argv[1] + "/src/device/cuda/kernels.rs", "OPT_BNB_SOURCE") + raw(sys.argv[1] + "/src/device/cuda/fp8.rs", "SOURCE")
# NVRTC 13.2 has no INFINITY without headers; defined here (if a source uses it) so the
# rest can be checked.
src = "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n" + src
prog = ctypes.c_void_p()
r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None)
assert r == 0, r
for arch in [b"--gpu-architecture=compute_90", b"--gpu-architecture=compute_80", b"--gpu-architecture=compute_75"]:
    opts = (ctypes.c_char_p * 1)(arch)
    r = lib.nvrtcCompileProgram(prog, 1, opts)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    print(arch.decode(), "rc", r, log.value.decode()[:3000])
    if r == 0:
        n = ctypes.c_size_t(); lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value); lib.nvrtcGetPTX(prog, ptx)
        p = ptx.value.decode()
        for k in ["layer_norm_f16", "layer_norm_bf16", "relu_f16", "add_out_bf16", "bnb4_dequant_f16", "bnb4_dequant_bf16", "bnb4_dequant_f32", "bnb4_nested_absmax", "convert_float", "fp8_absmax_f16", "fp8_absmax_bf16", "fp8_quant_f16", "fp8_quant_bf16", "fp8_requant"]:
            assert (".entry " + k + "(") in p, k
        print("  all OPT/bnb4/fp8 entries present; ptx bytes", len(p))
