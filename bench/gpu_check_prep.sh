#!/usr/bin/env bash
# Prepares the GPU check on a machine where PyPI can be reached: the wheels the GPU machine lacks go to
# ./.whl (ignored by git, never committed), each sized, with the total (docs/gpu-check.md).
#
#   bash scripts/bootstrap.sh                                # once: .venv, the versions the check uses
#   bash bench/gpu_check_prep.sh [--have FREEZE.txt] [--python 3.11]
#
# --have: `pip freeze` of the GPU machine's image (default: a typical CUDA image with torch,
# transformers, lightning, accelerate, peft and torchmetrics). --python: that image's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" bench/gpu_check_wheels.py prepare .whl --pip "${PIP:-python3 -m pip}" "$@"
