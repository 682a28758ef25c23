"""`jobgen rerun` on the real cluster (sbatch backend): one tiny CPU job, rerun from its record, gives
the same losses and test accuracy from the same script but for the run's folder and id."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import TINY_TRAIN, all_final, jobgen, manifest, only_run, wait_states, write_experiment

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
    jobgen("submit", str(exp), root=root)
    first = only_run(root, "again")
    assert list(wait_states(first, all_final, timeout=200, poll=3).values()) == [State.COMPLETED]

    jobgen("rerun", "again", root=root)
    (second,) = [p for p in (root / "again").iterdir() if p.name != first.name and not p.name.startswith(".")]
    assert list(wait_states(second, all_final, timeout=200, poll=3).values()) == [State.COMPLETED]

    doc = manifest(second)
    assert doc["rerun"]["of"] == first.name and doc["backend"] == "sbatch"
    assert doc["jobs"][0]["job_id"] != manifest(first)["jobs"][0]["job_id"]
    script = (second / "jobs" / "again" / "job.sbatch").read_text()
    assert script == (first / "jobs" / "again" / "job.sbatch").read_text().replace(first.name, second.name)
    assert f"export PYTHONPATH={second / 'code'}" in script
    assert len(_losses(first)) >= 3 and _losses(second) == _losses(first)
    assert _test_acc(second) == _test_acc(first)
