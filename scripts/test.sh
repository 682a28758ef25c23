#!/usr/bin/env bash
# The whole test suite, real Slurm included: install ./.venv (dev extras), start the test cluster
# (tests/cluster/up.sh: slurmctld + 3 slurmd nodes + accounting; needs root) and Chromium
# (scripts/browser.sh), run pytest, stop the cluster. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/lint.sh        # ruff check, ruff format --check, mypy --strict jobgen (as pre-commit does)
bash scripts/browser.sh     # Chromium, for the report's headless-browser test
bash tests/cluster/up.sh --accounting
trap 'bash tests/cluster/down.sh >/dev/null 2>&1 || true' EXIT
# shellcheck disable=SC1091
source "${JOBGEN_CLUSTER_DIR:-/tmp/jobgen-cluster}/env.sh"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# A cache of compiled extensions and tokenized data that survives between test sessions.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/jobgen-test/torch_extensions}"
.venv/bin/python -m pytest -q -ra -p no:cacheprovider --durations=15 "$@"
