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


def _chain_experiment(
    folder: Path, name: str, chain: int, need: int, partition: str, step_s: int, then_s: int | None = None
) -> Path:
    """`step_s`: a segment's first step, `then_s` each later one (default the same; tests/slurm/chain.sbatch.j2)."""
    shutil.copy(Path(__file__).parent / "chain.sbatch.j2", folder / "chain.sbatch.j2")
    steps = f'NEED = "{need}", STEP_S = "{step_s}", THEN_S = "{step_s if then_s is None else then_s}"'
    body = (
        f'[launch]\ntemplate = "chain.sbatch.j2"\n[slurm]\npartition = "{partition}"\ntime = "1"\n'
        f'cpus_per_task = 1\nchain = {chain}\n[env]\nvars = {{ {steps} }}\n[data]\ndataset = "imdb"\n'
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


def _seconds(elapsed: str) -> int:
    """Slurm's [D-]HH:MM:SS or MM:SS as seconds."""
    days, _, clock = elapsed.rpartition("-")
    return sum(int(p) * 60**i for i, p in enumerate(reversed(clock.split(":")))) + int(days or 0) * 86400


def _wait_for_line(log: Path, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and line in log.read_text()):
        assert time.monotonic() < deadline, f"no {line!r} in {log} after {timeout:.0f} s"
        time.sleep(0.5)


@pytest.mark.timeout(360)
def test_a_job_longer_than_the_limit_finishes_in_segments(short_partition: str, root: Path, tmp_path: Path):
    # A segment's first step takes 5 s and a later one 600 s: the first segment checkpoints step 1 and
    # its time limit ends it in step 2, the second resumes at step 1 and finishes step 2, the third
    # finds the training finished and stops at once. Once step 1 is done, the test brings the first
    # segment's end to now (scontrol update EndTime=now): Slurm ends it as TIMEOUT at its next check
    # of the limits (every 30 s), not 60-90 s after its start; its 1-minute limit stays the backstop.
    exp = _chain_experiment(tmp_path, "chain3", chain=3, need=2, partition=short_partition, step_s=5, then_s=600)
    out = jobgen("submit", str(exp), root=root).stdout
    run_dir = only_run(root, "chain3")
    (job,) = manifest(run_dir)["jobs"]
    assert len(job["segments"]) == 3 and job["job_id"] == job["segments"][0]
    assert "submitted as a chain of 3 jobs" in out, out
    deps = subprocess.run(["scontrol", "show", "job", job["segments"][1]], capture_output=True, text=True).stdout
    assert f"Dependency=afterany:{job['segments'][0]}" in deps, deps

    status = wait_states(run_dir, lambda s: True, timeout=1)
    job_dir = run_dir / job["dir"]
    _wait_for_line(job_dir / f"slurm-{job['segments'][0]}.out", "step 1 done", timeout=120)
    subprocess.run(["scontrol", "update", f"JobId={job['segments'][0]}", "EndTime=now"], check=True)
    states = wait_states(run_dir, all_final, timeout=240, poll=2)
    assert states[job["name"]] is State.COMPLETED, status
    # The job is complete once the training wrote its result; the last segment may still be waiting
    # for Slurm to start it (and stop at once).
    by_id = _segments_once_ended(job["segments"], timeout=120)
    assert [by_id[i].split()[0] for i in job["segments"]] == ["TIMEOUT", "COMPLETED", "COMPLETED"], by_id

    logs = {i: (job_dir / f"slurm-{i}.out").read_text() for i in job["segments"]}
    first, second, third = job["segments"]
    assert f"segment {first} resumes at step 0" in logs[first] and "step 1 done" in logs[first]
    assert "step 2 done" not in logs[first]  # the limit ended it in its second step
    # From the checkpoint the first one left.
    assert f"segment {second} resumes at step 1" in logs[second] and "finished at step 2" in logs[second]
    assert "training already finished; segment" in logs[third] and "resumes" not in logs[third]

    table = jobgen("status", str(run_dir), root=root).stdout
    row = next(line for line in table.splitlines() if line.startswith(job["name"]))
    assert ",".join(job["segments"]) in row and "COMPLETED" in row
    assert "segment 3/3 (TIMEOUT COMPLETED COMPLETED): done" in row, table
    elapsed = row.split("COMPLETED", 1)[1].split()[0]  # all segments together
    sacct = subprocess.run(
        ["sacct", "-n", "-P", "-X", "--format=JobID,Elapsed", "-j", ",".join(job["segments"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    each = dict(line.split("|") for line in sacct.splitlines())
    assert _seconds(elapsed) == sum(_seconds(each[i]) for i in job["segments"]) >= 2 * 5, (row, each)
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
