"""jobgen at scale on the real cluster: how many Slurm processes a command starts, and a submission
killed at random points then resumed, which must neither lose nor duplicate a job (issue 16).

The tools stay the real ones: a PATH shim in front of them only writes down which process ran them, so
the jobs (which inherit PATH) are not counted against jobgen.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import JOBGEN, all_final, behave_sweep, manifest, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]
TOOLS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "srun")


@pytest.fixture
def counted(tmp_path: Path) -> Path:
    folder = tmp_path / "shim"
    folder.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real, f"{tool} is missing: is the test cluster up?"
        (folder / tool).write_text(f'#!/bin/sh\necho "{tool} $PPID" >> "{folder}/calls"\nexec {real} "$@"\n')
        (folder / tool).chmod(0o755)
    return folder


def _jobgen(
    args: list[str], root: Path, shim: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], list[str]]:
    """Run jobgen to its end; returns the process (its output in `said`) and the Slurm tools it (not its
    jobs: those read files only) started."""
    (shim / "calls").unlink(missing_ok=True)
    env = {**os.environ, **(env or {}), "PATH": f"{shim}:{os.environ['PATH']}", "JOBGEN_OUTPUT_ROOT": str(root)}
    proc = subprocess.Popen([JOBGEN, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    proc.said = out  # type: ignore[attr-defined]
    lines = (shim / "calls").read_text().splitlines() if (shim / "calls").exists() else []
    return proc, [line.split()[0] for line in lines if line.split()[-1] == str(proc.pid)]


def test_status_of_an_ended_1000_job_run_asks_slurm_a_few_times(slurm, root: Path, tmp_path: Path, counted: Path):
    exp = behave_sweep(tmp_path, "wide", 1000)
    _, calls = _jobgen(["submit", str(exp), "--array"], root, counted)
    assert calls.count("sbatch") == 91, calls  # 1000 tasks in arrays of at most 11
    # Besides: the cluster's limits (scontrol show config) and the jobs queued against them (squeue), a
    # handful of calls for the whole sweep, never one per job.
    assert len(calls) - 91 <= 5 and set(calls) == {"sbatch", "scontrol", "squeue"}, calls
    run_dir = only_run(root, "wide")
    wait_states(run_dir, all_final, timeout=480, poll=5)
    # Wait states recorded them; make the manifest forget, so status must ask Slurm about all 1000.
    doc = manifest(run_dir)
    for job in doc["jobs"]:
        job["state"] = State.SUBMITTED.value
    (run_dir / "manifest.json").write_text(__import__("json").dumps(doc))
    for journal in run_dir.glob(".journal-*"):
        journal.unlink()
    for job in doc["jobs"]:  # and their results, so nothing but Slurm can tell how they ended
        (run_dir / job["dir"] / "result.json").rename(run_dir / job["dir"] / "result.json.kept")
    # A copy of the run, read first (the real squeue's answer in its thread meanwhile, the 1000 jobs'
    # logs then read for why): the run read after it says the same.
    twin = tmp_path / "twin" / run_dir.name
    shutil.copytree(run_dir, twin)
    alone, _ = _jobgen(["status", str(twin)], root, counted)
    proc, calls = _jobgen(["status", str(run_dir)], root, counted)
    assert 1 <= len(calls) <= 4, calls  # sacct (in chunks), squeue, scontrol: never one per job
    assert proc.said.replace(str(run_dir), "RUN") == alone.said.replace(str(twin), "RUN")
    assert [(j["state"], j.get("cause")) for j in manifest(run_dir)["jobs"]] == [
        (j["state"], j.get("cause")) for j in manifest(twin)["jobs"]
    ]
    assert {j["state"] for j in manifest(run_dir)["jobs"]} == {State.FAILED.value}  # COMPLETED without result
    for job in doc["jobs"]:
        (run_dir / job["dir"] / "result.json.kept").rename(run_dir / job["dir"] / "result.json")
    _, calls = _jobgen(["status", str(run_dir)], root, counted)
    assert calls == [], calls  # every job's final state is recorded now: Slurm is not asked again
    _, calls = _jobgen(["summary", str(run_dir), "--format", "json"], root, counted)
    assert calls == ["sacct"], calls  # the states are recorded; what the 1000 jobs used is one question
    states = {j["state"] for j in manifest(run_dir)["jobs"]}
    assert states == {State.COMPLETED.value}, states


def _queued_tags(run_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%k"], capture_output=True, text=True, check=True)
    return [line.split(" ", 1)[0] for line in out.stdout.splitlines() if line.startswith(f"jobgen:{run_id}:")]


def _held(root: Path) -> int:
    """How many jobs of the killed-submission test's run Slurm holds (0 before the run is written)."""
    made = sorted((root / "killed").glob("*/manifest.json")) if (root / "killed").is_dir() else []
    return len(_queued_tags(made[0].parent.name)) if made else 0


def test_a_submission_killed_at_random_points_resumes_without_losing_or_doubling_a_job(
    slurm, root: Path, tmp_path: Path
):
    seed = int(os.environ.get("JOBGEN_TEST_SEED") or random.SystemRandom().randrange(10**6))
    rng = random.Random(seed)
    exp = behave_sweep(tmp_path, "killed", 300)
    env = {**os.environ, "JOBGEN_OUTPUT_ROOT": str(root)}
    args = ["submit", str(exp)]
    kills = 0
    for _ in range(6):
        proc = subprocess.Popen(
            [JOBGEN, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        # Where it is killed: early (rendering, writing the run, its first sbatch calls) at a random time,
        # else once Slurm holds a random number of the run's jobs. A point counted in jobs, not seconds:
        # an idle machine submits the 300 in under 3 s, and a kill drawn in seconds then came too late.
        early = rng.random() < 0.3
        deadline = time.monotonic() + (rng.uniform(0.05, 0.6) if early else 300)
        target = rng.randrange(1, 250)
        while proc.poll() is None:
            if time.monotonic() >= deadline or (not early and _held(root) >= target):
                os.killpg(proc.pid, signal.SIGKILL)  # jobgen and the sbatch it may be running at that moment
                proc.wait()
                kills += 1
                break
            time.sleep(0.02)
        made = sorted((root / "killed").glob("*/manifest.json")) if (root / "killed").is_dir() else []
        if made and args[1] != "--resume":  # the run was written before the kill: resume it from now on
            assert len(made) == 1, made
            args = ["submit", "--resume", str(made[0].parent)]
        if proc.returncode == 0:
            break
    done = subprocess.run([JOBGEN, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"seed {seed}: {done.stdout}{done.stderr}"
    (run_dir,) = [m.parent for m in (root / "killed").glob("*/manifest.json")]
    jobs = manifest(run_dir)["jobs"]
    tags = _queued_tags(run_dir.name)
    assert kills >= 1, f"seed {seed}: no submission was killed"
    assert len(jobs) == 300 and all(j["job_id"] for j in jobs), f"seed {seed}: a job is lost"
    assert len(tags) == len(set(tags)) == 300, f"seed {seed}: {len(tags)} queued for 300 jobs"
    assert len({j["job_id"] for j in jobs}) == 300, f"seed {seed}: two jobs share an id"
