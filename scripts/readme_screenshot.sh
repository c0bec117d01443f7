#!/usr/bin/env bash
# Retakes assets/screenshot.png: the app under Xvfb on the simulated H100 with its first-launch
# settings (Llama-3-8B int8, dry), which it profiles by itself at launch: the lifetime view with
# the CxB state kept across passes highlighted. Needs xvfb-run and libX11 (python3 ctypes grabs
# the root window). Run from the repo root after `cargo build --release` (or name another
# binary in VRAMSCOPE_BIN).
set -euo pipefail
if [ -z "${VRAMSCOPE_SHOT_INNER:-}" ]; then
  VRAMSCOPE_SHOT_INNER=1 exec xvfb-run -a -s "-screen 0 1600x1000x24" bash "$0"
fi
# A fresh settings folder, so the first-launch defaults are what is shown.
export XDG_DATA_HOME="$(mktemp -d)" XDG_CONFIG_HOME="$(mktemp -d)"
"${VRAMSCOPE_BIN:-./target/release/vramscope}" &
app=$!
trap 'kill $app' EXIT
sleep 10                                        # opens, profiles the default case, draws
python3 - assets/screenshot.png 1600 1000 <<'PY'
import ctypes, ctypes.util, struct, sys, zlib
x = ctypes.CDLL(ctypes.util.find_library("X11"))
x.XOpenDisplay.restype = ctypes.c_void_p
x.XDefaultRootWindow.restype = ctypes.c_ulong
x.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
class XImage(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("width", "height", "xoffset", "format")] + [
        ("data", ctypes.POINTER(ctypes.c_ubyte))] + [(n, ctypes.c_int) for n in (
        "byte_order", "bitmap_unit", "bitmap_bit_order", "bitmap_pad", "depth",
        "bytes_per_line", "bits_per_pixel")]
x.XGetImage.restype = ctypes.POINTER(XImage)
x.XGetImage.argtypes = [ctypes.c_void_p, ctypes.c_ulong] + [ctypes.c_int] * 2 + [ctypes.c_uint] * 2 + [ctypes.c_ulong, ctypes.c_int]
d = x.XOpenDisplay(None)
w, h = int(sys.argv[2]), int(sys.argv[3])
img = x.XGetImage(d, x.XDefaultRootWindow(d), 0, 0, w, h, 0xFFFFFFFF, 2).contents
raw = ctypes.string_at(img.data, img.bytes_per_line * h)
rows = []
for y in range(h):
    line = raw[y * img.bytes_per_line:][: w * 4]
    rgb = bytearray(w * 3)
    rgb[0::3], rgb[1::3], rgb[2::3] = line[2::4], line[1::4], line[0::4]
    rows.append(b"\0" + bytes(rgb))
chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
open(sys.argv[1], "wb").write(png + chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b""))
PY
echo "wrote assets/screenshot.png"
