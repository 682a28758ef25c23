"""slurm.retries on the real cluster (three nodes n1..n3, one partition of all three): a job that fails is
requeued by its batch shell away from the node(s) it failed on, up to N times; a job that succeeds or is
cancelled is never retried; a job that fails everywhere stops when its retries are used up, or when one
more exclusion would leave the partition no node to run it on.

The jobs are tests/slurm/behave.sbatch.j2's (no training): each attempt notes its node in `attempts`.
Without exclusion Slurm would start the retry on the same idle node again (it fills the lowest first),
and the job that fails only on its first node would need more than one retry.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import (
    PYTHON,
    TINY_TRAIN,
    all_final,
    behave_experiment,
    jobgen,
    manifest,
    only_run,
    restarts,
    wait_states,
    write_experiment,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

POINTS = """
[[sweep.points]]
name = "flaky"
"env.vars" = { BEHAVIOR = "fail-on-first-node" }
"slurm.retries" = 2

[[sweep.points]]
name = "broken"
"env.vars" = { BEHAVIOR = "fail" }
"slurm.retries" = 2

[[sweep.points]]
name = "nowhere"
"env.vars" = { BEHAVIOR = "fail" }
"slurm.retries" = 5

[[sweep.points]]
name = "fine"
"env.vars" = { BEHAVIOR = "ok" }
"slurm.retries" = 2

[[sweep.points]]
name = "cancelled"
"env.vars" = { BEHAVIOR = "sleep" }
"slurm.retries" = 2
"""


RETRIED = ("flaky", "broken", "nowhere")


def _attempts(job_dir: Path) -> list[str]:
    path = job_dir / "attempts"
    return path.read_text().split() if path.exists() else []


def _excluded(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    return re.search(r"ExcNodeList=(\S+)", out).group(1)


def test_failed_jobs_are_retried_elsewhere_and_only_they(slurm, root: Path, tmp_path: Path):
    exp = behave_experiment(tmp_path, "retry", POINTS)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "retry")
    jobs = {j["name"]: j for j in manifest(run_dir)["jobs"]}
    dirs = {name: run_dir / job["dir"] for name, job in jobs.items()}
    wait_states(run_dir, lambda s: bool(_attempts(dirs["cancelled"])) and s["cancelled"] is State.RUNNING, 120, 1)
    jobgen("cancel", str(run_dir), "cancelled", root=root)

    states = wait_states(run_dir, all_final, timeout=360, poll=3)
    logs = {name: jobgen("logs", str(run_dir), name, root=root).stdout for name in jobs}
    errs = {name: jobgen("logs", str(run_dir), name, "--err", root=root).stdout for name in jobs}
    assert states == {
        "flaky": State.COMPLETED,
        "broken": State.FAILED,
        "nowhere": State.FAILED,
        "fine": State.COMPLETED,
        "cancelled": State.CANCELLED,
    }, errs
    record = {name: json.loads((d / "retries.json").read_text()) for name, d in dirs.items() if name in RETRIED}

    # Failed on its first node only: retried once, on another node, which it never left.
    first, second = _attempts(dirs["flaky"])
    assert first != second and (dirs["flaky"] / "first-node").read_text().strip() == first
    assert record["flaky"] == {"schema": 1, "retries": 1, "limit": 2, "excluded": [first], "stopped": None}
    assert restarts(jobs["flaky"]["job_id"]) == 1 and _excluded(jobs["flaky"]["job_id"]) == first
    assert f"retry 1 of 2, excluding {first}" in logs["flaky"] and "restarts 1" in logs["flaky"]

    # Fails everywhere: exactly 1 + 2 attempts, each on a node of its own, then its retries are used up.
    tried = _attempts(dirs["broken"])
    assert len(tried) == 3 and len(set(tried)) == 3, tried
    assert record["broken"]["retries"] == 2 and record["broken"]["stopped"] == "retries used up"
    assert record["broken"]["excluded"] == tried[:2] and restarts(jobs["broken"]["job_id"]) == 2
    assert "its retries are used up (2 of 2): not retried" in errs["broken"]

    # Five retries allowed, but after three nodes failed no node of the partition is left to try.
    tried = _attempts(dirs["nowhere"])
    assert len(tried) == 3 and len(set(tried)) == 3, tried
    assert record["nowhere"]["retries"] == 2 and record["nowhere"]["stopped"] == "no node left to retry on"
    assert "would leave 0 of the 3 nodes of partition debug for a job of 1 node(s)" in errs["nowhere"]

    # Succeeded, or cancelled: one attempt, no record, never requeued.
    for name in ("fine", "cancelled"):
        assert len(_attempts(dirs[name])) == 1 and not (dirs[name] / "retries.json").exists(), name
        assert restarts(jobs[name]["job_id"]) == 0, name
    assert "scontrol requeue" not in logs["cancelled"] + logs["fine"]

    status = jobgen("status", str(run_dir), root=root).stdout
    rows = {line.split()[0]: line for line in status.splitlines()[2:]}
    assert f"1/2 excl {first}" in rows["flaky"], status
    assert "2/2 excl" in rows["broken"] and ": retries used up" in rows["broken"], status
    summary = {
        r["config"]: r
        for r in json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)["rows"]
    }
    assert summary["flaky"]["retries"] == 1 and summary["flaky"]["excluded_nodes"] == first
    assert summary["flaky"]["state"] == "COMPLETED" and summary["broken"]["retries"] == 2
    assert summary["fine"]["retries"] == 0 and summary["fine"]["excluded_nodes"] is None


HERE = Path(__file__).parent
CRASH = '[launch]\ntemplate = "crash.sbatch.j2"\n[slurm]\ncpus_per_task = 1\nretries = 1\n' + TINY_TRAIN.replace(
    'model = "builtin:tiny"', 'model = "builtin:tiny"\nengine = "torch"'
).replace("epochs = 1", "epochs = 2").replace("[400, 100, 100]", "[200, 50, 50]").replace(
    f'python = "{PYTHON}"', f'python = "{PYTHON}"\nvars = {{ CRASH_PY = "{HERE / "crash_after_checkpoint.py"}" }}'
)


@pytest.mark.training
@pytest.mark.timeout(600)
def test_a_training_that_dies_on_its_node_resumes_from_its_checkpoint_elsewhere(slurm, root: Path, tmp_path: Path):
    """One tiny 1-rank training whose rank dies on the node of its first attempt right after the first
    epoch's checkpoint: the retry runs on another node, resumes there, and trains the second epoch only."""
    shutil.copy(HERE / "crash.sbatch.j2", tmp_path / "crash.sbatch.j2")
    exp = write_experiment(tmp_path, "retrain", CRASH)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "retrain")
    job = manifest(run_dir)["jobs"][0]
    job_dir = run_dir / job["dir"]
    states = wait_states(run_dir, all_final, timeout=540, poll=3)
    err = jobgen("logs", str(run_dir), "--err", root=root).stdout
    assert states[job["name"]] is State.COMPLETED, err[-3000:]
    first = (job_dir / "first-node").read_text().strip()
    assert f"crash: {first} breaks after the first checkpoint" in err
    result = json.loads((job_dir / "result.json").read_text())
    assert result["resumed"] is True and result["requeue_count"] == 1, result
    assert result["epochs_done"] == 2 and len(result["val_acc_per_epoch"]) == 2
    assert result["slurm"]["nodelist"] != first
    assert json.loads((job_dir / "retries.json").read_text())["excluded"] == [first]
