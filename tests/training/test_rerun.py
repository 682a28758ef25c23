"""`jobgen rerun` of a completed CPU job repeats its losses and test accuracy to 6 decimals, from a
checkout whose training/ was edited after the first run: the rerun runs the run's code snapshot.

The checkout is a copy of jobgen/ and training/ in a temporary folder (the repository's own files stay
as they are), and the CLI runs from it, as a user's would.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import REPO, subprocess_env

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(900)]

TINY = """
[experiment]
name = "tiny"

[launch]
backend = "local"

[train]
engine = "torch"
model = "builtin:tiny"
accelerator = "cpu"
epochs = 1
batch_size = 32
eval_batch_size = 128
lr = 3e-3
num_workers = 0
log_every_n_steps = 2
deterministic = true
seed = 3

[data]
dataset = "builtin:synthetic"
partition = [200, 50, 100]
max_length = 32
"""


def _losses(run: Path) -> list[str]:
    with open(run / "jobs" / "tiny" / "metrics.csv", newline="") as fh:
        return [f"{float(row['loss']):.6f}" for row in csv.DictReader(fh) if row["split"] == "train" and row["loss"]]


def _test_acc(run: Path) -> float:
    return float(json.loads((run / "jobs" / "tiny" / "result.json").read_text())["test_acc"])


def test_a_rerun_repeats_the_losses_of_the_snapshot_after_training_was_edited(tmp_path: Path):
    checkout = tmp_path / "checkout"
    for package in ("jobgen", "training"):
        shutil.copytree(REPO / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    experiment = tmp_path / "tiny.toml"
    experiment.write_text(TINY)
    runs = tmp_path / "runs"
    env = {**subprocess_env({"JOBGEN_OUTPUT_ROOT": str(runs)}), "PYTHONPATH": str(checkout)}

    def jobgen(*args: str) -> Path:
        done = subprocess.run(
            [sys.executable, "-m", "jobgen.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # by the manifest's last write: two runs made in one second tie on their ids' time part
        return max((runs / "tiny").iterdir(), key=lambda p: (p / "manifest.json").stat().st_mtime_ns)

    first = jobgen("submit", str(experiment))
    optim = checkout / "training" / "optim.py"
    text = optim.read_text()
    assert "lr=t.lr)" in text
    optim.write_text(text.replace("lr=t.lr)", "lr=t.lr * 3)"))  # edited after the first run

    again = jobgen("rerun", "tiny")
    assert json.loads((again / "manifest.json").read_text())["rerun"]["of"] == first.name
    assert "lr=t.lr * 3" not in (again / "code" / "training" / "optim.py").read_text()
    assert len(_losses(first)) >= 3
    assert _losses(again) == _losses(first)
    assert f"{_test_acc(again):.6f}" == f"{_test_acc(first):.6f}"

    # The edit changes the losses: a new submit from the edited checkout runs it.
    edited = jobgen("submit", str(experiment))
    assert _losses(edited) != _losses(first)
