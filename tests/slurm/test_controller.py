"""The controller goes away mid-sweep: a clear error, a manifest that says which jobs are queued, and
`submit --resume` after the restart submits only the rest (no duplicates)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import REPO, all_final, behave_sweep, jobgen, manifest, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]
CONTROLLER = REPO / "tests" / "cluster" / "controller.sh"


# Passes every call to the real sbatch; after the first job is queued, stops the controller. The first
# job is queued held: one that Slurm launches in the moment the controller goes down can fail on its own
# (its srun step or its launch report has no controller to talk to), which is Slurm's race, not the
# submission path under test. The test releases it once the controller is back.
WRAPPER = """#!/bin/bash
if [ -e "$MARK" ]; then exec "$REAL_SBATCH" "$@"; fi
"$REAL_SBATCH" --hold "$@"
rc=$?
touch "$MARK"
bash "$CONTROLLER" stop
exit $rc
"""


def _controller(action: str) -> None:
    subprocess.run(["bash", str(CONTROLLER), action], check=True, timeout=60)


def test_controller_down_midway_then_resume(slurm, root: Path, tmp_path: Path):
    exp = behave_sweep(tmp_path, "ctldown", 3)
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(WRAPPER)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{wrapper.parent}:{os.environ['PATH']}",
        "REAL_SBATCH": shutil.which("sbatch"),
        "MARK": str(tmp_path / "stopped"),
        "CONTROLLER": str(CONTROLLER),
    }
    try:
        done = jobgen("submit", str(exp), root=root, env=env, check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        message = done.stderr.strip().splitlines()[-1]
        assert "Unable to contact slurm controller" in message and "1 of 3 jobs submitted" in message
        assert "jobgen submit --resume" in message and "Traceback" not in done.stderr
        run_dir = only_run(root, "ctldown")
        jobs = manifest(run_dir)["jobs"]
        assert jobs[0]["job_id"] and [j["job_id"] for j in jobs[1:]] == [None, None]
        assert "Unable to contact" in jobs[1]["error"] and jobs[2]["state"] == "NOT_SUBMITTED"
    finally:
        _controller("start")
    _wait_nodes_idle()
    jobgen("submit", "--resume", str(run_dir), root=root)
    jobgen("submit", "--resume", str(run_dir), root=root)  # again: nothing left, nothing duplicated
    jobs = manifest(run_dir)["jobs"]
    ids = [j["job_id"] for j in jobs]
    assert all(ids) and len(set(ids)) == 3
    subprocess.run(["scontrol", "release", ids[0]], check=True, timeout=30)
    states = wait_states(run_dir, all_final, timeout=120)
    assert set(states.values()) == {State.COMPLETED}, _explain(ids)
    # Every job the controller holds (finished ones stay for MinJobAge): ours appear once each.
    # Ids grow, so any duplicate of this run's jobs has an id at least its first one's.
    held = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i %j"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    first = min(int(i) for i in ids)
    ours = [
        name
        for jid, _, name in (line.partition(" ") for line in held if line)
        if int(jid) >= first and name.startswith("ctldown.")
    ]
    assert sorted(ours) == sorted(f"ctldown.{j['name']}" for j in jobs), ours


def _explain(ids: list[str]) -> str:
    """What Slurm says of each job, for a failure message."""
    done = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o", "JobID,State,ExitCode,Reason"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout + done.stderr


def _wait_nodes_idle(timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%T"], capture_output=True, text=True).stdout
        if out.split() and all(s.startswith(("idle", "mix", "alloc")) for s in out.split()):
            return
        time.sleep(1)
    raise AssertionError(f"nodes not back after the controller restart: {out}")
