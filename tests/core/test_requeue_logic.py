"""`jobgen requeue` against stub Slurm tools: which jobs it picks, which Slurm command each gets, what
the manifest keeps. tests/slurm/test_requeue_command.py runs the same command on the real cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.commands import requeue as requeue_mod
from jobgen.record.model import Run
from jobgen.states import JobInfo, State
from tests.core.conftest import fake_squeue
from tests.support.stub_tools import install_stubs

SWEEP = """
[experiment]
name = "rq"
[slurm]
gpus_per_node = 1
requeue = {requeue}
[data]
dataset = "imdb"
[sweep.grid]
"train.seed" = [1, 2, 3, 4]
"""

# sbatch prints ids 1001, 1002, ...; scontrol/scancel log their argv, and scontrol refuses the ids
# listed in $FORGOTTEN as Slurm does for a job past MinJobAge.
STUBS = {
    "sbatch": """n=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STATE/calls"
echo "sbatch $*" >> "$STATE/argv"
echo "$(( 1000 + n ))"
""",
    "scontrol": """echo "scontrol $*" >> "$STATE/argv"
if [ -n "$DOWN" ]; then echo "scontrol: error: Unable to contact slurm controller (connect failure)" >&2; exit 1; fi
for id in $FORGOTTEN; do
  if [ "$2" = "$id" ]; then echo "Requeue of JobId=$id failed: Invalid job id specified" >&2; exit 1; fi
done
""",
    "scancel": """echo "scancel $*" >> "$STATE/argv"
""",
    # Before it submits a job again, requeue asks which copies Slurm holds: none here.
    "squeue": """echo "squeue $*" >> "$STATE/argv"
""",
}


@pytest.fixture
def stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_stubs(tmp_path, monkeypatch, STUBS)


def _run(
    runner,
    tmp_path: Path,
    stubs: Path,
    monkeypatch,
    states: list[State],
    *names: str,
    requeue: bool = False,
    forgotten: str = "",
    no_result: bool = False,
):
    """Submit a 4-job sweep to the stub sbatch, make Slurm report `states`, then `jobgen requeue`."""
    exp = tmp_path / "rq.toml"
    exp.write_text(SWEEP.format(requeue=str(requeue).lower()))
    root = tmp_path / "runs"
    assert runner.invoke(main, ["--output-root", str(root), "submit", str(exp)]).exit_code == 0
    (stubs / "argv").unlink()
    (run_dir,) = [p for p in (root / "rq").iterdir() if p.is_dir()]
    for i, state in enumerate(states):
        if state is State.COMPLETED and not no_result:  # a job that completed wrote its result
            (run_dir / "jobs" / f"seed-{i + 1}" / "result.json").write_text('{"schema": 1}')
    by_id = {str(1001 + i): JobInfo(state) for i, state in enumerate(states)}
    fake_squeue(monkeypatch, lambda ids: {i: by_id[i] for i in ids if i in by_id})
    monkeypatch.setenv("FORGOTTEN", forgotten)
    result = runner.invoke(main, ["--output-root", str(root), "requeue", "rq", *names])
    argv = (stubs / "argv").read_text().splitlines() if (stubs / "argv").exists() else []
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    return result, argv, jobs, run_dir


def test_a_job_that_exited_0_without_its_result_is_requeued(runner, tmp_path, stubs, monkeypatch):
    states = [State.COMPLETED, State.COMPLETED, State.RUNNING, State.RUNNING]
    result, argv, jobs, _ = _run(runner, tmp_path, stubs, monkeypatch, states, no_result=True)
    assert result.exit_code == 0, result.output
    assert "seed-1 (FAILED" in result.output and argv == ["scontrol requeue 1001", "scontrol requeue 1002"]


def test_default_picks_only_jobs_that_ended_without_success(runner, tmp_path, stubs, monkeypatch):
    states = [State.FAILED, State.COMPLETED, State.RUNNING, State.TIMEOUT]
    result, argv, jobs, _ = _run(runner, tmp_path, stubs, monkeypatch, states)
    assert result.exit_code == 0, result.output
    assert argv == ["scontrol requeue 1001", "scontrol requeue 1004"]
    assert [j["job_id"] for j in jobs] == ["1001", "1002", "1003", "1004"]  # Slurm keeps the ids
    assert [j.get("requeues") for j in jobs] == [1, None, None, 1]
    assert jobs[0]["state"] == State.REQUEUED.value and jobs[1]["state"] == State.COMPLETED.value
    assert "2 job(s) requeued" in result.output
    assert "seed-2" not in result.output and "seed-3" not in result.output  # not picked, so not listed


def test_a_job_slurm_forgot_is_submitted_again_and_keeps_its_old_id(runner, tmp_path, stubs, monkeypatch):
    states = [State.FAILED, State.NODE_FAIL, State.COMPLETED, State.COMPLETED]
    result, argv, jobs, run_dir = _run(runner, tmp_path, stubs, monkeypatch, states, forgotten="1002")
    assert result.exit_code == 0, result.output
    assert argv[:2] == ["scontrol requeue 1001", "scontrol requeue 1002"]
    assert argv[2:4] == ["squeue -h -r -t all -o %i|%k", f"sbatch --parsable {run_dir / jobs[1]['script']}"]
    assert jobs[1]["job_id"] == "1005" and jobs[1]["previous_job_ids"] == ["1002"] and jobs[1]["requeues"] == 1
    assert "resubmitted" in result.output and "Invalid job id specified" in result.output


def test_named_running_job_gets_its_warning_signal_when_requeue_is_on(runner, tmp_path, stubs, monkeypatch):
    states = [State.RUNNING, State.RUNNING, State.PENDING, State.COMPLETED]
    result, argv, jobs, _ = _run(
        runner, tmp_path, stubs, monkeypatch, states, "seed-1", "seed-3", "seed-4", requeue=True
    )
    assert result.exit_code == 0, result.output
    assert argv == ["scancel --signal=USR2 1001"]  # the pending and the completed job are left alone
    lines = result.output.splitlines()
    assert any("seed-3" in line and "skipped" in line and "still queued" in line for line in lines), result.output
    assert any("seed-4" in line and "skipped" in line and "completed" in line for line in lines), result.output
    assert jobs[1].get("requeues") is None


def test_named_running_job_without_requeue_is_requeued_by_slurm(runner, tmp_path, stubs, monkeypatch):
    states = [State.RUNNING, State.RUNNING, State.RUNNING, State.RUNNING]
    result, argv, _, _ = _run(runner, tmp_path, stubs, monkeypatch, states, "seed-2")
    assert result.exit_code == 0, result.output
    assert argv == ["scontrol requeue 1002"]
    assert "no checkpoint was asked for first" in result.output


def test_nothing_to_requeue_says_so(runner, tmp_path, stubs, monkeypatch):
    states = [State.COMPLETED, State.RUNNING, State.PENDING, State.COMPLETED]
    result, argv, _, _ = _run(runner, tmp_path, stubs, monkeypatch, states)
    assert result.exit_code == 0 and argv == []
    assert "nothing to requeue" in result.output


def test_unknown_job_name_is_one_line_error(runner, tmp_path, stubs, monkeypatch):
    states = [State.FAILED] * 4
    result, argv, jobs, _ = _run(runner, tmp_path, stubs, monkeypatch, states, "seed-9")
    assert result.exit_code == 1 and argv == []
    assert "no job 'seed-9'" in result.output and "seed-1" in result.output
    assert all(j.get("requeues") is None for j in jobs)


def test_local_and_dry_runs_are_refused(runner, tmp_path, monkeypatch):
    exp = tmp_path / "rq.toml"
    exp.write_text(SWEEP.format(requeue="false"))
    root = tmp_path / "runs"
    assert runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--dry-run"]).exit_code == 0
    result = runner.invoke(main, ["--output-root", str(root), "requeue", "rq"])
    assert result.exit_code == 1 and "dry run" in result.output
    local = Run(tmp_path, {"backend": "local", "jobs": []}, [])
    monkeypatch.setattr(requeue_mod, "read_runs", lambda run_dirs, **how: [local])
    with pytest.raises(requeue_mod.JobgenError, match="local backend"):
        requeue_mod.requeue(tmp_path, [])


def test_an_array_task_slurm_forgot_goes_in_again_as_a_one_task_array(runner, tmp_path, stubs, monkeypatch):
    exp = tmp_path / "rq.toml"
    exp.write_text(SWEEP.format(requeue="false"))
    root = tmp_path / "runs"
    assert runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--array"]).exit_code == 0
    (stubs / "argv").unlink()
    states = {"1001_0": State.COMPLETED, "1001_1": State.FAILED, "1001_2": State.COMPLETED, "1001_3": State.FAILED}
    (run_dir,) = (root / "rq").iterdir()
    for done in ("seed-1", "seed-3"):  # the tasks that completed wrote their results
        (run_dir / "jobs" / done / "result.json").write_text('{"schema": 1}')
    fake_squeue(monkeypatch, lambda ids: {i: JobInfo(states[i]) for i in ids if i in states})
    monkeypatch.setenv("FORGOTTEN", "1001_3")
    result = runner.invoke(main, ["--output-root", str(root), "requeue", "rq"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "rq").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    script = run_dir / manifest["arrays"][0]["script"]
    argv = (stubs / "argv").read_text().splitlines()
    # Slurm is asked for copies an earlier requeue may have queued before the task goes in again.
    assert argv == [
        "scontrol requeue 1001_1",
        "scontrol requeue 1001_3",
        "squeue -h -r -t all -o %i|%k",
        f"sbatch --parsable --array=3 {script}",
    ]
    jobs = manifest["jobs"]
    assert [j["job_id"] for j in jobs] == ["1001_0", "1001_1", "1001_2", "1002_3"]
    assert jobs[3]["previous_job_ids"] == ["1001_3"]


def test_no_answer_from_slurm_is_not_a_refusal(runner, tmp_path, stubs, monkeypatch):
    """A job Slurm cannot be asked about may be alive: nothing is resubmitted."""
    monkeypatch.setenv("DOWN", "1")
    states = [State.UNKNOWN, State.UNKNOWN, State.COMPLETED, State.COMPLETED]
    result, argv, jobs, _ = _run(runner, tmp_path, stubs, monkeypatch, states)
    assert result.exit_code == 1
    assert argv == ["scontrol requeue 1001"]  # stopped at the first job, and no sbatch
    message = result.output.strip().splitlines()
    assert (
        len(message) == 1 and "Unable to contact slurm controller" in message[0] and "once Slurm answers" in message[0]
    )
    assert [j["job_id"] for j in jobs] == ["1001", "1002", "1003", "1004"] and not any(j.get("requeues") for j in jobs)
