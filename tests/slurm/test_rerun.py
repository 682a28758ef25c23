"""`jobgen rerun` on the real cluster (sbatch backend): one tiny CPU job, rerun from its record after the
checkout's training/ was edited, gives the same losses and test accuracy from the same script but for
the run's folder and id: the jobs run the run's code snapshot. (That the edit changes the losses is
shown on the local backend, tests/training/test_rerun.py.)

The checkout is a copy of jobgen/ and training/ in the test's folder, which the nodes share; the CLI runs
from it, as a user's would."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import TINY_TRAIN, all_final, manifest, only_run, wait_states, write_experiment

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slurm, pytest.mark.training]


def _losses(run: Path) -> list[str]:
    with open(run / "jobs" / "again" / "metrics.csv", newline="") as fh:
        return [f"{float(row['loss']):.6f}" for row in csv.DictReader(fh) if row["split"] == "train" and row["loss"]]


def _test_acc(run: Path) -> str:
    return f"{json.loads((run / 'jobs' / 'again' / 'result.json').read_text())['test_acc']:.6f}"


@pytest.mark.timeout(480)
def test_a_rerun_on_the_cluster_repeats_the_job(slurm, root: Path, tmp_path: Path):
    body = "[slurm]\ncpus_per_task = 1\n" + TINY_TRAIN.replace("[train]\n", "[train]\ndeterministic = true\n")
    exp = write_experiment(tmp_path, "again", body)
    checkout = tmp_path / "checkout"
    for package in ("jobgen", "training"):
        shutil.copytree(REPO / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "JOBGEN_OUTPUT_ROOT": str(root), "PYTHONPATH": str(checkout)}

    def jobgen(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "jobgen.cli", *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    jobgen("submit", str(exp))
    first = only_run(root, "again")
    assert list(wait_states(first, all_final, timeout=200, poll=3).values()) == [State.COMPLETED]
    optim = checkout / "training" / "optim.py"
    assert "lr=t.lr)" in optim.read_text()
    optim.write_text(optim.read_text().replace("lr=t.lr)", "lr=t.lr * 3)"))  # edited after the first run

    jobgen("rerun", "again")
    (second,) = [p for p in (root / "again").iterdir() if p.name != first.name and not p.name.startswith(".")]
    assert list(wait_states(second, all_final, timeout=200, poll=3).values()) == [State.COMPLETED]

    doc = manifest(second)
    assert doc["rerun"]["of"] == first.name and doc["backend"] == "sbatch"
    assert doc["jobs"][0]["job_id"] != manifest(first)["jobs"][0]["job_id"]
    script = (second / "jobs" / "again" / "job.sbatch").read_text()
    assert script == (first / "jobs" / "again" / "job.sbatch").read_text().replace(first.name, second.name)
    assert f"export PYTHONPATH={second / 'code'}" in script
    assert "lr=t.lr * 3" not in (second / "code" / "training" / "optim.py").read_text()
    assert len(_losses(first)) >= 3 and _losses(second) == _losses(first)
    assert _test_acc(second) == _test_acc(first)
