"""Successive halving on the real cluster: a 9-point sweep as a job array, three tasks at a time on three
nodes. The jobs report at rung 1, pause (their allocation ends) or go on; a later report promotes a
paused task, which is requeued as `<array>_<task>` and resumes from its checkpoint. The test applies
the rule to the recorded rung metrics that each decision's maker read (its decision file names them)
and compares it with what the jobs did; then a stopped job requeued after its rung report keeps its
decision (it passes the rung again, is not promoted past the rule, and ends paused once more)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm.helpers import PYTHON, jobgen, manifest, only_run, write_experiment
from training import halving

pytestmark = [pytest.mark.slurm, pytest.mark.training, pytest.mark.timeout(600)]

BODY = f"""
[env]
python = "{PYTHON}"
[slurm]
cpus_per_task = 1
time = "00:10:00"
[launch]
array = true
array_parallelism = 3
[train]
model = "builtin:tiny"
engine = "torch"
accelerator = "cpu"
epochs = 2
batch_size = 16
eval_batch_size = 64
num_workers = 0
[data]
dataset = "builtin:synthetic"
partition = [97, 61, 31]
max_length = 16
[sweep.grid]
"train.lr" = [1e-5, 3e-1, 3e-3, 1e-4, 1e-2, 3e-5, 1e-3, 3e-2, 3e-4]
[sweep.halving]
rungs = [1]
"""


def _wait_settled(run_dir: Path, root: Path, timeout: float) -> dict:
    """`jobgen status` (it promotes and requeues what the jobs left undecided) until every job ended."""
    deadline = time.monotonic() + timeout
    while True:
        out = jobgen("status", str(run_dir), root=root, check=False)
        if out.returncode == 0:
            rows = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)["rows"]
            if all(r["outcome"] in ("finished", "stopped") for r in rows):
                return {r["config"]: r for r in rows}
        assert time.monotonic() < deadline, out.stdout[-3000:] + out.stderr[-3000:]
        time.sleep(3)


def test_halving_sweep_on_slurm(slurm, root: Path, tmp_path: Path) -> None:
    exp = write_experiment(tmp_path, "halv", BODY)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "halv")
    rows = _wait_settled(run_dir, root, 480)
    base = halving.root(run_dir)
    reports = halving.read_reports(base, 1)
    assert len(reports) == 9 == len(rows)
    metrics = {j: r["metric"] for j, r in reports.items()}
    promoted = halving.promoted(base, 1)
    assert len(promoted) == 9 // 3  # after the last report (and a status), exactly what the rule allows
    for name in promoted:
        made = halving.decision(base, 1, name)
        assert made is not None
        seen = {j: metrics[j] for j in made["seen"]}
        k = len(seen) // 3
        # The rule on what its maker read: in the top floor(n/eta) of those reports, in a slot below that.
        assert name in halving.ranked(seen, "max")[:k] and made["slot"] < k, (name, made, metrics)
    # The best job of the sweep always goes on: the last report frees a slot for it if it has none.
    assert halving.ranked(metrics, "max")[0] in promoted
    finished = {name for name, row in rows.items() if row["outcome"] == "finished"}
    assert finished == promoted
    for name, row in rows.items():
        assert row["rung"] == 1 and row["rung_metrics"] == [round(metrics[name], 6)]
    jobs = {j["name"]: j for j in manifest(run_dir)["jobs"]}
    for name, report in reports.items():  # a task names itself as `scontrol requeue` must: <array>_<task>
        assert report["requeue_id"] == jobs[name]["job_id"]

    # A stopped job requeued after its rung report keeps its decision.
    stopped = next(name for name in sorted(reports) if name not in promoted)
    subprocess.run(["scontrol", "requeue", jobs[stopped]["job_id"]], check=True)
    time.sleep(3)
    rows = _wait_settled(run_dir, root, 120)
    assert rows[stopped]["outcome"] == "stopped"
    assert halving.promoted(base, 1) == promoted
    assert halving.read_reports(base, 1)[stopped]["time"] == reports[stopped]["time"]  # not reported twice
    assert not (run_dir / jobs[stopped]["dir"] / "result.json").exists()
