"""Chained jobs (slurm.chain) on the real cluster: a job longer than its partition's 1-minute limit runs
as segments linked with afterany, each resuming from the checkpoint; a segment after the one that
finished stops at once; status and summary show one job with its segments; cancel cancels them all.

The work stands in for training (tests/slurm/chain.sbatch.j2): it takes wall time, not CPU, so the
number of segments it needs does not depend on how busy the machine is. That training itself resumes
from its checkpoints is tested in tests/training/test_resume.py and tests/slurm/test_requeue.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import all_final, jobgen, manifest, only_run, wait_states, write_experiment

pytestmark = [pytest.mark.slurm]

PARTITION = "short"  # MaxTime=1 (minute)


@pytest.fixture
def short_partition(slurm) -> str:
    """A partition with a 1-minute limit, made on the running cluster when it has none."""
    shown = subprocess.run(["scontrol", "show", "partition", PARTITION], capture_output=True, text=True)
    if shown.returncode != 0:
        nodes = subprocess.run(
            ["sinfo", "-h", "-p", "debug", "-o", "%N"], capture_output=True, text=True, check=True
        ).stdout.strip()
        subprocess.run(
            ["scontrol", "create", f"PartitionName={PARTITION}", f"Nodes={nodes}", "MaxTime=1", "State=UP"], check=True
        )
        shown = subprocess.run(["scontrol", "show", "partition", PARTITION], capture_output=True, text=True, check=True)
    assert "MaxTime=00:01:00" in shown.stdout, shown.stdout
    return PARTITION


def _chain_experiment(folder: Path, name: str, chain: int, need: int, partition: str, step_s: int = 48) -> Path:
    shutil.copy(Path(__file__).parent / "chain.sbatch.j2", folder / "chain.sbatch.j2")
    body = (
        f'[launch]\ntemplate = "chain.sbatch.j2"\n[slurm]\npartition = "{partition}"\ntime = "1"\n'
        f'cpus_per_task = 1\nchain = {chain}\n[env]\nvars = {{ NEED = "{need}", STEP_S = "{step_s}" }}\n[data]\ndataset = "imdb"\n'
    )
    return write_experiment(folder, name, body)


def _segments_once_ended(segments: list[str], timeout: float) -> dict[str, str]:
    """sacct's state of each segment, once every one has ended."""
    deadline = time.monotonic() + timeout
    while True:
        sacct = subprocess.run(
            ["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(segments)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        by_id = dict(line.split("|") for line in sacct.splitlines())
        ended = all(by_id.get(i, "").split(" ")[0] in ("COMPLETED", "TIMEOUT", "FAILED", "CANCELLED") for i in segments)
        if ended or time.monotonic() > deadline:
            return by_id
        time.sleep(2)


@pytest.mark.timeout(600)
def test_a_job_longer_than_the_limit_finishes_in_segments(short_partition: str, root: Path, tmp_path: Path):
    # Slurm ends a 1-minute job 60-90 s after it starts (it checks limits every 30 s): a segment finishes
    # one 48-s step and dies in the second, whatever the machine's load, so 2 steps need 2 segments; the
    # third segment finds the training finished and stops at once.
    exp = _chain_experiment(tmp_path, "chain3", chain=3, need=2, partition=short_partition)
    out = jobgen("submit", str(exp), root=root).stdout
    run_dir = only_run(root, "chain3")
    (job,) = manifest(run_dir)["jobs"]
    assert len(job["segments"]) == 3 and job["job_id"] == job["segments"][0]
    assert "submitted as a chain of 3 jobs" in out, out
    deps = subprocess.run(["scontrol", "show", "job", job["segments"][1]], capture_output=True, text=True).stdout
    assert f"Dependency=afterany:{job['segments'][0]}" in deps, deps

    status = wait_states(run_dir, lambda s: True, timeout=1)
    states = wait_states(run_dir, all_final, timeout=480, poll=5)
    assert states[job["name"]] is State.COMPLETED, status
    # The job is complete once the training wrote its result; the last segment may still be waiting
    # for Slurm to start it (and stop at once).
    by_id = _segments_once_ended(job["segments"], timeout=120)
    assert [by_id[i].split()[0] for i in job["segments"]] == ["TIMEOUT", "COMPLETED", "COMPLETED"], by_id

    job_dir = run_dir / job["dir"]
    logs = {i: (job_dir / f"slurm-{i}.out").read_text() for i in job["segments"]}
    first, second, third = job["segments"]
    assert f"segment {first} resumes at step 0" in logs[first] and "step 1 done" in logs[first]
    # From the checkpoint the first one left.
    assert f"segment {second} resumes at step 1" in logs[second] and "finished at step 2" in logs[second]
    assert "training already finished; segment" in logs[third] and "resumes" not in logs[third]

    table = jobgen("status", str(run_dir), root=root).stdout
    row = next(line for line in table.splitlines() if line.startswith(job["name"]))
    assert ",".join(job["segments"]) in row and "COMPLETED" in row
    assert "segment 3/3 (TIMEOUT COMPLETED COMPLETED): done" in row, table
    elapsed = row.split("COMPLETED", 1)[1].split()[0]  # all segments together: one limit and a step
    assert "00:01:40" <= elapsed <= "00:02:50", row
    (line,) = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)["rows"]
    assert line["state"] == "COMPLETED" and line["test_acc"] == 0.9
    text = jobgen("summary", str(run_dir), "--format", "markdown", root=root).stdout
    assert "3 segments: TIMEOUT → COMPLETED → COMPLETED" in text, text


@pytest.mark.timeout(180)
def test_cancel_cancels_every_segment(short_partition: str, root: Path, tmp_path: Path):
    exp = _chain_experiment(tmp_path, "chaincancel", chain=3, need=10, partition=short_partition, step_s=5)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "chaincancel")
    (job,) = manifest(run_dir)["jobs"]
    wait_states(run_dir, lambda s: s[job["name"]] is State.RUNNING, timeout=60)
    out = jobgen("cancel", str(run_dir), root=root).stdout
    assert "1 job(s) cancelled" in out and f"cancel sent to jobs {', '.join(job['segments'])}" in out
    states = wait_states(run_dir, all_final, timeout=60)
    assert states[job["name"]] is State.CANCELLED
    # The accounting is written after the controller and lags it (the pending segments' cancel reached
    # it seconds later in one CI run): each segment's state there is waited for, up to 30 s.
    deadline = time.monotonic() + 30
    while True:
        sacct = subprocess.run(
            ["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(job["segments"])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        said = [s.split("|")[1].split()[0] for s in sacct.splitlines()]
        if said == ["CANCELLED"] * 3 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert said == ["CANCELLED"] * 3, sacct
