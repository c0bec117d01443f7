#!/usr/bin/env python3
"""Compiles the CUDA kernel sources with NVRTC, without a GPU, as compile_kernels
(src/device/cuda/ops.rs) concatenates them, and checks that the entry points are in the PTX:

  the main module   kernels.rs SOURCE + sampler.rs SOURCE + kernels.rs OPT_BNB_SOURCE + fp8.rs
                    SOURCE + moe.rs SOURCE + device/synth.rs SOURCE, for compute_90,
                    compute_80 and compute_75, and as cubins for sm_90 and sm_80;
  the tensor-core   kernels.rs FLASH_SOURCE + w4.rs SOURCE + moe.rs GEMM_SOURCE (+ WGMMA_SOURCE
  module            for compute_90a), for compute_90a and compute_80.

NVRTC comes from the pip wheel `nvidia-cuda-nvrtc` (pulled in by `pip install torch`, or
`pip download "nvidia-cuda-nvrtc>=13,<14" --no-deps` and unzip it).

Run: python3 scripts/nvrtc_check.py . path/to/libnvrtc.so.13
"""
import ctypes
import re
import sys

root = sys.argv[1]
lib = ctypes.CDLL(sys.argv[2] if len(sys.argv) > 2 else
                  "/tmp/optref/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13")


def raw(path, name):
    s = open(root + "/src/device/cuda/" + path).read()
    m = re.search(r'(?:pub\((?:crate|super)\) )?const %s: &str = r#"(.*?)"#;' % name, s, re.S)
    return m.group(1)


def names(path, name):
    s = open(root + "/src/device/cuda/" + path).read()
    m = re.search(r'const %s: &\[&str\] =\s*&\[(.*?)\];' % name, s, re.S)
    return re.findall(r'"([a-z0-9_]+)"', m.group(1))


def compile_ptx(src, arch):
    # NVRTC 13.2 on has no INFINITY without headers; defined here (if a source uses it) so the
    # rest can be checked.
    src = "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n" + src
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(("--gpu-architecture=" + arch).encode())
    r = lib.nvrtcCompileProgram(prog, 1, opts)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        sys.exit(f"{arch}: NVRTC failed ({r}):\n{log.value.decode()[:4000]}")
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def check(ptx, entries, what, arch):
    missing = [k for k in entries if (".entry " + k + "(") not in ptx]
    if missing:
        sys.exit(f"{what} {arch}: missing entries {missing}")
    print(f"{what} {arch}: {len(entries)} entries present, PTX {len(ptx)} bytes")


def compile_cubin(src, arch):
    """NVRTC's cubin for a real architecture, as src/device/cuda/kcache.rs builds it."""
    src = "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n" + src
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(("--gpu-architecture=" + arch).encode())
    if lib.nvrtcCompileProgram(prog, 1, opts) != 0:
        sys.exit(f"{arch}: NVRTC could not build a cubin")
    n = ctypes.c_size_t()
    assert lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)) == 0
    print(f"cubin {arch}: {n.value} bytes")
    return n.value


synth = re.search(r'pub const SOURCE: &str = r#"(.*?)"#;',
                  open(root + "/src/device/synth.rs").read(), re.S).group(1)
main = (raw("kernels.rs", "SOURCE") + raw("sampler.rs", "SOURCE") + raw("kernels.rs", "OPT_BNB_SOURCE")
        + raw("fp8.rs", "SOURCE") + raw("moe.rs", "SOURCE") + synth)
typed = (names("kernels.rs", "TYPED") + names("sampler.rs", "TYPED") + names("kernels.rs", "OPT_BNB_TYPED")
         + names("fp8.rs", "TYPED") + names("moe.rs", "TYPED"))
untyped = (names("kernels.rs", "UNTYPED") + names("sampler.rs", "UNTYPED")
           + names("kernels.rs", "OPT_BNB_UNTYPED") + names("fp8.rs", "UNTYPED")
           + names("moe.rs", "UNTYPED"))
entries = untyped + ["synth_weights", "synth_int8_rows"] + [f"{n}_{s}" for n in typed for s in ("f16", "bf16")]
for arch in ["compute_90", "compute_80", "compute_75"]:
    check(compile_ptx(main, arch), entries, "main module", arch)

tc = raw("kernels.rs", "FLASH_SOURCE") + raw("w4.rs", "SOURCE") + raw("moe.rs", "GEMM_SOURCE")
tc_entries = [f"{n}_{s}" for n in names("w4.rs", "NAMES") + names("moe.rs", "GEMM_NAMES")
              for s in ("f16", "bf16")]
check(compile_ptx(tc + raw("kernels.rs", "WGMMA_SOURCE"), "compute_90a"), tc_entries, "tensor-core module",
      "compute_90a")
check(compile_ptx(tc, "compute_80"), tc_entries, "tensor-core module", "compute_80")
# The kernel cache's cubins (the architectures the H200 and an A100 run).
assert compile_cubin(main, "sm_90") > 0
assert compile_cubin(tc + raw("kernels.rs", "WGMMA_SOURCE"), "sm_90a") > 0
assert compile_cubin(main, "sm_80") > 0
