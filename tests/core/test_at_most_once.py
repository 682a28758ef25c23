"""At-most-once submission against stub Slurm tools: sbatch queues the job, then its reply is lost (an
error, or no answer at all). `submit --resume` finds the job by the tag in its comment and submits it
no second time. The real-cluster version is tests/slurm/test_at_most_once.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobgen.cli import main
from tests.support.stub_tools import install_stubs

SWEEP = """
[experiment]
name = "amo"
[data]
dataset = "imdb"
[sweep.grid]
"train.seed" = [1, 2, 3]
"""
# sbatch queues the job (id|comment in $STATE/queue, as squeue -o '%i|%k' shows it), then on call $LOSE_AT
# fails as a lost reply does, or on call $HANG_AT never answers.
STUBS = {
    "sbatch": """n=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STATE/calls"
script="${@: -1}"
echo "$(( 1000 + n ))|$(sed -n 's/^#SBATCH --comment=//p' "$script")" >> "$STATE/queue"
if [ "${LOSE_AT:-0}" = "$n" ]; then echo "sbatch: error: Socket timed out on send/recv operation" >&2; exit 1; fi
if [ "${HANG_AT:-0}" = "$n" ]; then sleep 60; fi
echo "$(( 1000 + n ))"
""",
    "squeue": """echo "squeue $*" >> "$STATE/asked"
if [ -n "$DOWN" ]; then echo "squeue: error: Unable to contact slurm controller" >&2; exit 1; fi
cat "$STATE/queue" 2>/dev/null
""",
}


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = install_stubs(tmp_path, monkeypatch, STUBS)
    (tmp_path / "amo.toml").write_text(SWEEP)
    return state


def _submit(runner, tmp_path: Path, *args: str):
    return runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", *args])


def _run_dir(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / "runs" / "amo").iterdir()
    return run_dir


def _queued(state: Path) -> list[str]:
    return [line.split("|", 1)[1] for line in (state / "queue").read_text().splitlines()]


@pytest.mark.parametrize("failure", ["lost reply", "no answer"])
def test_a_job_queued_without_a_reply_is_found_not_submitted_again(runner, tmp_path, slurm, monkeypatch, failure):
    if failure == "lost reply":
        monkeypatch.setenv("LOSE_AT", "2")
    else:
        monkeypatch.setenv("HANG_AT", "2")
        monkeypatch.setattr("jobgen.backends._tools.SUBMIT_TIMEOUT_S", 1)
    result = _submit(runner, tmp_path, str(tmp_path / "amo.toml"))
    assert result.exit_code == 1 and "jobgen submit --resume" in result.output, result.output
    run_dir = _run_dir(tmp_path)
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert jobs[0]["job_id"] == "1001" and jobs[1]["job_id"] is None and jobs[1]["submit_tried_at"]

    monkeypatch.delenv("LOSE_AT", raising=False)
    monkeypatch.delenv("HANG_AT", raising=False)
    result = _submit(runner, tmp_path, "--resume", str(run_dir))
    assert result.exit_code == 0, result.output
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert [j["job_id"] for j in jobs] == ["1001", "1002", "1003"]
    assert jobs[1]["found_on_cluster"] is True and "found_on_cluster" not in jobs[2]
    tags = _queued(slurm)
    assert len(tags) == 3 and len(set(tags)) == 3, tags  # each job queued once
    assert tags == [f"jobgen:{run_dir.name}:{j['name']}" for j in jobs]


def test_a_refusal_queues_nothing_so_resume_does_not_ask(runner, tmp_path, slurm, monkeypatch):
    sbatch = Path(os.environ["PATH"].split(":")[0]) / "sbatch"
    sbatch.write_text("#!/bin/bash\necho 'sbatch: error: Batch job submission failed: Invalid partition' >&2\nexit 1\n")
    result = _submit(runner, tmp_path, str(tmp_path / "amo.toml"))
    assert result.exit_code == 1 and "Invalid partition" in result.output
    jobs = json.loads((_run_dir(tmp_path) / "manifest.json").read_text())["jobs"]
    assert jobs[0]["submit_tried_at"] is None
    sbatch.write_text("#!/bin/bash\necho 1001\n")
    assert _submit(runner, tmp_path, "--resume", str(_run_dir(tmp_path))).exit_code == 0
    assert not (slurm / "asked").exists()


def test_resume_refuses_when_slurm_cannot_say_what_it_holds(runner, tmp_path, slurm, monkeypatch):
    monkeypatch.setenv("LOSE_AT", "1")
    assert _submit(runner, tmp_path, str(tmp_path / "amo.toml")).exit_code == 1
    monkeypatch.delenv("LOSE_AT")
    monkeypatch.setenv("DOWN", "1")
    result = _submit(runner, tmp_path, "--resume", str(_run_dir(tmp_path)))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "nothing was submitted again" in lines[0], result.output
    assert (slurm / "calls").read_text().strip() == "1"  # no second sbatch
