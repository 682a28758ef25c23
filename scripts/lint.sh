#!/usr/bin/env bash
# The checks that keep the code as it is: lint, format, types. scripts/test.sh runs them before pytest;
# .pre-commit-config.yaml runs the same on each commit (pre-commit install).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict jobgen training
echo "lint: ruff check, ruff format --check and mypy --strict jobgen training passed"
