"""A halving sweep on the local backend, end to end: the jobs pause at their rung, a later report
promotes the best one (the first to run), the runner resumes it from its checkpoint, and what the jobs
did matches the rule replayed on the recorded rung metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import subprocess_env
from training import halving

JOBGEN = str(Path(sys.executable).parent / "jobgen")

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(600)]

EXPERIMENT = """
[experiment]
name = "halv"
[launch]
backend = "local"
[train]
model = "builtin:tiny"
engine = "torch"
accelerator = "cpu"
epochs = 2
batch_size = 32
eval_batch_size = 128
warmup_ratio = 0.1
num_workers = 0
[data]
dataset = "builtin:synthetic"
partition = [301, 100, 100]
max_length = 32
[[sweep.points]]
"train.lr" = 3e-3
[[sweep.points]]
"train.lr" = 1e-5
[[sweep.points]]
"train.lr" = 1e-1
[sweep.halving]
rungs = [1]
"""


def test_local_halving_sweep(tmp_path: Path) -> None:
    (tmp_path / "halv.toml").write_text(EXPERIMENT)
    done = subprocess.run(
        [JOBGEN, "submit", "halv.toml"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs" / "halv").iterdir()
    base = halving.root(run_dir)
    reports = {job: r["metric"] for job, r in halving.read_reports(base, 1).items()}
    assert len(reports) == 3
    # The rule replayed in report order: nobody goes on at n = 1 or 2; at n = 3 the best does.
    order = sorted(reports, key=lambda j: halving.read_reports(base, 1)[j]["time"])
    for n in (1, 2):
        assert halving.promotable({j: reports[j] for j in order[:n]}, set(), 3, "max") == []
    (best,) = halving.promotable(reports, set(), 3, "max")
    assert halving.promoted(base, 1) == {best}
    finished = {p.parent.name for p in (run_dir / "jobs").glob("*/result.json")}
    assert finished == {best}
    result = json.loads((run_dir / "jobs" / best / "result.json").read_text())
    assert len(result["val_acc_per_epoch"]) == 2  # resumed after its rung: both epochs recorded
    summary = subprocess.run(
        [JOBGEN, "summary", str(run_dir), "--format", "json"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = {r["config"]: r for r in json.loads(summary.stdout)["rows"]}
    for job, row in rows.items():
        assert row["rung"] == 1
        assert row["rung_metrics"] == [round(reports[job], 6)]
        assert row["outcome"] == ("finished" if job == best else "stopped")
        # A job halving stopped ended without its result: never shown as COMPLETED.
        assert row["state"] == ("COMPLETED" if job == best else "STOPPED@1"), row
        assert row["rung_metric"] == "accuracy"  # the task's primary metric, the default
    # A local run's hours: its jobs' wall-clock hours, the promoted one's two runs together.
    from jobgen.record.store import load_manifest

    ran = {e["name"]: e["ran_s"] for e in load_manifest(run_dir)["jobs"]}
    totals = json.loads(summary.stdout)["totals"]
    assert totals["hours_kind"] == "wall"
    assert totals["hours_used"] == pytest.approx(sum(ran.values()) / 3600, abs=2e-6)
    full = sum(s if job == best else 2 * s for job, s in ran.items()) / 3600  # the stopped ones: 1 of 2 epochs
    assert totals["full_sweep_hours"] == pytest.approx(full, abs=2e-6)
