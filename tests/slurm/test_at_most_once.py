"""At-most-once submission on the real cluster: an sbatch wrapper submits the job, then hangs or fails as a
lost reply does. `submit --resume` and `requeue` find the job Slurm took (by the tag in its comment) and
submit it no second time: every job is on the cluster exactly as often as jobgen meant."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import all_final, behave_experiment, behave_sweep, jobgen, manifest, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

# Submits for real, then on call $BREAK_AT hangs (sbatch never answers) or fails (the reply is lost).
WRAPPER = """#!/bin/bash
n=$(( $(cat "$WRAP_STATE/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$WRAP_STATE/calls"
out=$({sbatch} "$@") || exit $?
if [ "$n" = "$BREAK_AT" ]; then
  case "$MODE" in
    hang) sleep 300 ;;
    fail) echo "sbatch: error: Socket timed out on send/recv operation" >&2; exit 1 ;;
  esac
fi
echo "$out"
"""


def tagged(run_dir: Path) -> Counter:
    """How many jobs Slurm holds per jobgen tag of this run (the controller's memory, then accounting)."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%k"], capture_output=True, text=True, check=True
    ).stdout
    prefix = f"jobgen:{run_dir.name}:"
    ids = {}
    for line in out.splitlines():
        job_id, _, comment = line.partition("|")
        if comment.startswith(prefix):
            ids[job_id] = comment.split(" ", 1)[0].removeprefix(prefix)
    return Counter(ids.values())


@pytest.fixture
def wrapper(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "wrap"
    folder.mkdir()
    (folder / "sbatch").write_text(WRAPPER.replace("{sbatch}", shutil.which("sbatch")))
    (folder / "sbatch").chmod(0o755)
    import os

    return {"PATH": f"{folder}:{os.environ['PATH']}", "WRAP_STATE": str(folder), "JOBGEN_SBATCH_TIMEOUT": "5"}


@pytest.mark.parametrize("mode", ["hang", "fail"])
def test_submit_resume_finds_the_job_whose_reply_was_lost(slurm, root: Path, tmp_path: Path, wrapper, mode: str):
    exp = behave_sweep(tmp_path, f"amo{mode}", seeds=3)
    done = jobgen("submit", str(exp), root=root, check=False, env={**wrapper, "BREAK_AT": "2", "MODE": mode})
    assert done.returncode == 1 and "jobgen submit --resume" in done.stderr, done.stderr
    run_dir = only_run(root, f"amo{mode}")
    names = [j["name"] for j in manifest(run_dir)["jobs"]]
    assert [bool(j["job_id"]) for j in manifest(run_dir)["jobs"]] == [True, False, False]
    assert tagged(run_dir) == Counter(names[:2])  # Slurm took the second job all the same

    out = jobgen("submit", "--resume", str(run_dir), root=root).stdout
    jobs = manifest(run_dir)["jobs"]
    assert all(j["job_id"] for j in jobs) and jobs[1].get("found_on_cluster") is True, out
    assert tagged(run_dir) == Counter(names), "a job was submitted twice"
    states = wait_states(run_dir, all_final, timeout=120)
    assert set(states.values()) == {State.COMPLETED}, states
    assert tagged(run_dir) == Counter(names)


def test_requeue_finds_the_copy_whose_reply_was_lost(slurm, root: Path, tmp_path: Path, wrapper):
    sweep = '[[sweep.points]]\nname = "pinned"\n"env.vars" = { BEHAVIOR = "fail-once" }\n"slurm.extra" = { no-requeue = true }\n'
    exp = behave_experiment(tmp_path, "amorq", sweep)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "amorq")
    first = manifest(run_dir)["jobs"][0]["job_id"]
    wait_states(run_dir, lambda s: s["pinned"] is State.FAILED, timeout=90)
    # Slurm refuses to requeue a --no-requeue job: the script goes in again, and that reply is lost.
    done = jobgen("requeue", str(run_dir), root=root, check=False, env={**wrapper, "BREAK_AT": "1", "MODE": "fail"})
    assert done.returncode == 1 and "run jobgen requeue again" in done.stderr, done.stderr
    assert manifest(run_dir)["jobs"][0]["job_id"] == first and tagged(run_dir) == Counter({"pinned": 2})

    out = jobgen("requeue", str(run_dir), root=root).stdout
    assert "nothing submitted again" in out, out
    job = manifest(run_dir)["jobs"][0]
    assert job["job_id"] != first and job["previous_job_ids"] == [first]
    states = wait_states(run_dir, all_final, timeout=90)
    assert states == {"pinned": State.COMPLETED}
    assert tagged(run_dir) == Counter({"pinned": 2}), "the job went in a third time"
