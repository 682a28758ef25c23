#!/usr/bin/env bash
# The local demo: install jobgen with the training stack into ./.venv, then run
# experiments/local_demo.toml on this machine (no cluster, no internet, a few minutes) and print
# the summary (curves for TensorBoard too). Extra arguments go to `jobgen submit` (e.g. --output-root /tmp/runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh train,summary,trackers
exec .venv/bin/jobgen submit experiments/local_demo.toml "$@"
