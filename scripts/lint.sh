#!/usr/bin/env bash
# The checks that keep the code as it is: lint, format, types. scripts/test.sh runs them before pytest;
# .pre-commit-config.yaml runs the same on each commit (pre-commit install).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict jobgen training
.venv/bin/mypy --strict tests/support/api_example.py   # the docs' example of jobgen.api, as a user's file
echo "lint: ruff check, ruff format --check and mypy --strict jobgen training (and the docs' API example) passed"
