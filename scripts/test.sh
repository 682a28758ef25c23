#!/usr/bin/env bash
# The whole test suite, real Slurm included: install ./.venv (dev extras), start the test clusters
# (tests/cluster/up.sh: slurmctld + 3 slurmd nodes each; needs root) and Chromium (scripts/browser.sh),
# build the docs site (mkdocs build --strict),
# run pytest on $JOBGEN_TEST_WORKERS pytest-xdist workers (default 3), stop the clusters. Extra
# arguments go to pytest.
#
# Each worker has two clusters of its own, one with accounting and one without (tests/support/slurm_cluster.py:
# names, nets and directories derive from JOBGEN_CLUSTER_NAME/_NET/_DIR, defaults jobgen, 10.77.77,
# /tmp/jobgen-cluster; worker 0's accounting cluster is that default one). The Slurm tests that mostly
# wait (time limits, requeues, preemption, sacct) run on worker 0 (workers 0 and 1 with 4) while the others keep both
# cores busy with training (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${JOBGEN_TEST_WORKERS:-3}"
bash scripts/bootstrap.sh
# A cache of compiled extensions (DeepSpeed's CPU ops: ~40 s of CPU to build) that survives between
# test sessions, one per checkout: the build's hash covers the include paths inside .venv, so two
# checkouts sharing one folder would rebuild it each time the other had run. On a fresh machine it is
# built now, in the background, while lint, Chromium and the clusters start (tests/support/warm_builds.py).
checkout_key="$(pwd -P | cksum | cut -d' ' -f1)"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/jobgen-test/torch_extensions/${checkout_key}}"
# mypy's own cache, kept the same way: a fresh clone's type check of training/ (torch's, transformers'
# and Lightning's stubs) takes about a minute, with the kept cache a few seconds (mypy re-reads what changed).
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$HOME/.cache/jobgen-test/mypy/${checkout_key}}"
.venv/bin/python -m tests.support.warm_builds > .venv/warm_builds.log 2>&1 &
warm_builds=$!
bash scripts/lint.sh        # ruff check, ruff format --check, mypy --strict jobgen (as pre-commit does)
# The docs site (mkdocs.yml): a broken link or anchor, or a page left out of the navigation, fails the run.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .venv/docs-site   # not --quiet: it hides the warnings --strict counts
bash scripts/browser.sh     # Chromium, for the report's headless-browser test
bash tests/cluster/up.sh --accounting   # the first cluster alone: it installs Slurm when missing
trap '.venv/bin/python -m tests.support.slurm_cluster down --workers "$workers" >/dev/null 2>&1 || true' EXIT
.venv/bin/python -m tests.support.slurm_cluster up --workers "$workers"
# shellcheck disable=SC1091
source "${JOBGEN_CLUSTER_DIR:-/tmp/jobgen-cluster}/env.sh"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
wait "$warm_builds" || echo "test.sh: tests/support/warm_builds.py failed (the first DeepSpeed rank builds it instead): $(tail -1 .venv/warm_builds.log)"
parallel=()
[ "$workers" -le 1 ] || parallel=(-n "$workers" --dist loadgroup)
.venv/bin/python -m pytest -q -ra -p no:cacheprovider --durations=15 "${parallel[@]}" "$@"
