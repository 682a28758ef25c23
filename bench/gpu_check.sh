#!/usr/bin/env bash
# The GPU check, for a machine with one GPU and no internet (bench/gpu_check.py says what it runs).
#
#   bash bench/gpu_check.sh [gpu_check.py arguments]     # e.g. --steps 30 --sweep-steps 400
#
# Packages the machine lacks travel as wheels in ./.whl (see docs/contributing.md, "Checking the GPU paths"):
# they are installed into /tmp/site first. Output and a JSON report go to $OUT (or ./gpu-check).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
out="${OUT:-$PWD/gpu-check}"
mkdir -p "$out"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="$out/torch_extensions"
set -o pipefail
"$py" bench/gpu_check.py --out "$out/runs" "$@" 2>&1 | tee "$out/gpu_check.log"
