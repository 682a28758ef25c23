#!/usr/bin/env bash
# The GPU check: one run of at most 8 minutes on a machine with one GPU and no internet
# (docs/gpu-check.md; bench/gpu_check.py says what it runs).
#
#   bash bench/gpu_check.sh [gpu_check.py arguments]     # e.g. --cpu: the CI-sized form on a CPU
#
# Packages the machine lacks travel as wheels in ./.whl (bench/gpu_check_prep.sh makes them where PyPI
# can be reached); those the machine lacks are installed into /tmp/site-packages, which goes first on
# PYTHONPATH for this script and every job it starts. Output: $OUT (or ./gpu-check): gpu_check.log and
# gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
out="${OUT:-$PWD/gpu-check}"
mkdir -p "$out"
{
    if compgen -G ".whl/*.whl" >/dev/null; then
        # A folder named site-packages: dill (datasets' fingerprints) pickles modules from any other by
        # value, which fails for pyarrow's types.
        "$py" bench/gpu_check_wheels.py install .whl /tmp/site-packages
        export PYTHONPATH="/tmp/site-packages${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda",
          torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
    # DeepSpeed's JIT-built extensions go outside $OUT: it keeps two files.
    export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/jobgen-gpu-check-extensions}"
    "$py" bench/gpu_check.py --out "$out" "$@"
} 2>&1 | tee "$out/gpu_check.log"
