"""The end of a job on the real cluster (issue 20): a rank that dies on the way out, after rank 0 wrote
result.json, ends a finished job (COMPLETED, the result kept, a note in the log); without a result
the job wrote itself, the step's failure stands (FAILED), a stale result.json included.

The ranks are tests/slurm/behave.sbatch.j2's (no training): what is under test is the generated
script's guard (templates/_result_guard.j2) under real srun --kill-on-bad-exit and Slurm's accounting."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import all_final, behave_experiment, jobgen, manifest, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

POINTS = """
[[sweep.points]]
name = "finished"
"env.vars" = { BEHAVIOR = "finish-then-abort" }
"slurm.nodes" = 2

[[sweep.points]]
name = "lost"
"env.vars" = { BEHAVIOR = "abort" }
"slurm.nodes" = 2

[[sweep.points]]
name = "stale"
"env.vars" = { BEHAVIOR = "abort" }
"slurm.nodes" = 2
"slurm.extra" = { begin = "now+3600" }
"""


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "--format=State,ExitCode", "-j", job_id], capture_output=True, text=True, check=True
    ).stdout
    return out.strip()


def test_a_rank_that_aborts_after_the_result_ends_a_finished_job(slurm, root: Path, tmp_path: Path):
    exp = behave_experiment(tmp_path, "exit", POINTS)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "exit")
    jobs = {j["name"]: j for j in manifest(run_dir)["jobs"]}
    # "stale" waits (begin=now+1h) while it gets a result.json from an earlier run, then starts.
    stale_dir = run_dir / jobs["stale"]["dir"]
    (stale_dir / "result.json").write_text(json.dumps({"schema": 1, "job": "stale", "test_acc": 0.5}) + "\n")
    subprocess.run(["scontrol", "update", f"jobid={jobs['stale']['job_id']}", "StartTime=now"], check=True)

    states = wait_states(run_dir, all_final, timeout=200)
    logs = {
        name: "".join(p.read_text() for p in sorted((run_dir / job["dir"]).glob("slurm-*.*")))
        for name, job in jobs.items()
    }
    assert states == {"finished": State.COMPLETED, "lost": State.FAILED, "stale": State.FAILED}, logs
    # Slurm itself records the finished job as completed: the guard turned the step's abort into 0.
    assert _sacct_state(jobs["finished"]["job_id"]).startswith("COMPLETED|0:0")
    assert _sacct_state(jobs["lost"]["job_id"]).startswith("FAILED")
    finished = logs["finished"]
    # The rank's own last words ("terminate called without an active exception") are forwarded by
    # Slurm's I/O and can be lost when srun kills the step first; srun's line about the task is not.
    assert "task 1: Aborted" in finished, finished
    assert "then its step exited with status" in finished and "the job counts as completed" in finished
    for name in ("lost", "stale"):
        assert "task 1: Aborted" in logs[name] and "counts as completed" not in logs[name], logs[name]
    assert json.loads((run_dir / jobs["finished"]["dir"] / "result.json").read_text())["test_acc"] == 0.9

    summary = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)
    rows = {r["config"]: r for r in summary["rows"]}
    assert rows["finished"]["state"] == "COMPLETED" and rows["finished"]["test_acc"] == 0.9, rows["finished"]
    assert rows["lost"]["state"] == "FAILED" and rows["lost"]["test_acc"] is None, rows["lost"]
    # Slurm's FAILED stands after the read that recorded it: the stale result.json does not overturn it.
    assert rows["stale"]["state"] == "FAILED", rows["stale"]
    assert {j["name"]: j["state"] for j in manifest(run_dir)["jobs"]} == {s: v.value for s, v in states.items()}
