"""The sbatch path against stub Slurm tools on PATH: ids parsed, partial failure recorded, resume exact.

The real-cluster tests (tests/slurm/) cover the same paths against slurmctld; these pin the logic.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.errors import SubmitError

SWEEP = """
[experiment]
name = "fake"
[slurm]
gpus_per_node = 1
[data]
dataset = "imdb"
[sweep.grid]
"train.seed" = [1, 2, 3]
"""

FAKE_SBATCH = """#!/bin/bash
# Fails on the call whose number is in $FAIL_AT (1-based); else prints the next id.
n=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STATE/calls"
echo "$*" >> "$STATE/argv"
if [ "${FAIL_AT:-0}" = "$n" ]; then
  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
  exit 1
fi
echo "$(( 1000 + n ))${SUFFIX:-}"
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    return state


def _submit(runner, tmp_path: Path, *extra: str):
    exp = tmp_path / "fake.toml"
    exp.write_text(SWEEP)
    return runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp), *extra])


def test_submit_records_every_id(runner, tmp_path: Path, fake_slurm: Path, monkeypatch):
    monkeypatch.setenv("SUFFIX", ";cluster1")
    result = _submit(runner, tmp_path)
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs" / "fake").iterdir()
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert [j["job_id"] for j in jobs] == ["1001", "1002", "1003"]
    assert all(j["state"] == "SUBMITTED" and j["submitted_at"] for j in jobs)
    argv = (fake_slurm / "argv").read_text().splitlines()
    assert argv == [f"--parsable {run_dir / j['script']}" for j in jobs]


def test_failure_midway_then_resume_submits_only_the_rest(runner, tmp_path: Path, fake_slurm: Path, monkeypatch):
    monkeypatch.setenv("FAIL_AT", "2")
    result = _submit(runner, tmp_path)
    assert result.exit_code == 1
    message = result.output.strip().splitlines()[-1]
    assert "Invalid partition name specified" in message and "1 of 3 jobs submitted" in message
    assert "jobgen submit --resume" in message and "Traceback" not in result.output
    (run_dir,) = (tmp_path / "runs" / "fake").iterdir()
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert [j["job_id"] for j in jobs] == ["1001", None, None]
    assert "Invalid partition" in jobs[1]["error"] and jobs[2]["state"] == "NOT_SUBMITTED"

    monkeypatch.delenv("FAIL_AT")
    result = runner.invoke(main, ["submit", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert [j["job_id"] for j in jobs] == ["1001", "1003", "1004"]
    assert jobs[1]["error"] is None
    # Resuming a complete run submits nothing: no duplicates.
    result = runner.invoke(main, ["submit", "--resume", str(run_dir)])
    assert result.exit_code == 0
    assert (fake_slurm / "calls").read_text().strip() == "4"


def test_unparsable_output_is_an_error_with_the_raw_text():
    from jobgen.backends._tools import parse_job_id

    assert parse_job_id("123\n") == "123" and parse_job_id("77;c\n") == "77"
    with pytest.raises(SubmitError, match="Submitted batch job"):
        parse_job_id("Submitted batch job x\n")


def test_missing_sbatch_is_a_clear_error(runner, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = _submit(runner, tmp_path)
    assert result.exit_code == 1 and "sbatch not found on PATH" in result.output
    (run_dir,) = (tmp_path / "runs" / "fake").iterdir()
    assert all(j["state"] == "NOT_SUBMITTED" for j in json.loads((run_dir / "manifest.json").read_text())["jobs"])


def test_dry_run_cannot_be_resumed(runner, tmp_path: Path, fake_slurm: Path):
    assert _submit(runner, tmp_path, "--dry-run").exit_code == 0
    (run_dir,) = (tmp_path / "runs" / "fake").iterdir()
    result = runner.invoke(main, ["submit", "--resume", str(run_dir)])
    assert result.exit_code == 1 and "dry run" in result.output
    assert not (fake_slurm / "calls").exists()


def test_array_split_by_max_array_size(runner, tmp_path: Path, fake_slurm: Path, monkeypatch):
    bin_dir = Path(__import__("shutil").which("sbatch")).parent
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/bash\necho 'MaxArraySize            = 2'\n")
    scontrol.chmod(0o755)
    result = _submit(runner, tmp_path, "--array", "--array-parallelism", "1")
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs" / "fake").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [a["tasks"] for a in manifest["arrays"]] == [["seed-1", "seed-2"], ["seed-3"]]
    assert [j["job_id"] for j in manifest["jobs"]] == ["1001_0", "1001_1", "1002_0"]
    first = (run_dir / "arrays" / "array-0.sbatch").read_text()
    assert (
        "#SBATCH --array=0-1%1" in first
        and "#SBATCH --array=0-0%1" in (run_dir / "arrays" / "array-1.sbatch").read_text()
    )
    assert str(run_dir / "jobs" / "seed-2" / "job.sbatch") in first
    assert (fake_slurm / "calls").read_text().strip() == "2"
    lint = __import__("subprocess").run(
        ["shellcheck", str(run_dir / "arrays" / "array-0.sbatch")], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout


def test_array_refuses_mixed_resources(runner, tmp_path: Path):
    exp = tmp_path / "mixed.toml"
    exp.write_text(SWEEP.replace('"train.seed" = [1, 2, 3]', '"slurm.cpus_per_task" = [1, 2]'))
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp), "--array", "--dry-run"])
    assert result.exit_code == 1 and "launch.array" in result.output and "cpus-per-task" in result.output
    assert not (tmp_path / "runs").exists()


def test_submitit_parameters_come_from_the_same_config(tmp_path: Path):
    from jobgen.backends.submitit import executor_parameters

    spec = {
        "experiment": "e",
        "job": "j",
        "slurm": {
            "nodes": 2,
            "ntasks_per_node": 4,
            "cpus_per_task": 8,
            "time": "1-00:30",
            "gpus_per_node": 4,
            "gpu_type": "",
            "partition": "gpu",
            "account": "",
            "qos": "",
            "mem": "64g",
            "constraint": "",
            "exclusive": True,
            "extra": {"mail-type": "END", "hold": False, "requeue-x": True},
        },
    }
    params = executor_parameters(spec, tmp_path / "setup.sh")
    assert params["nodes"] == 2 and params["tasks_per_node"] == 4 and params["gpus_per_node"] == 4
    assert params["timeout_min"] == 1470 and params["slurm_mem"] == "64G" and params["slurm_partition"] == "gpu"
    assert params["slurm_setup"] == [f"source {tmp_path / 'setup.sh'}"] and params["slurm_exclusive"] is True
    assert params["slurm_additional_parameters"] == {"mail_type": "END", "requeue_x": None}


TEST_ONLY_SBATCH = """#!/bin/bash
echo "$*" >> "$STATE/argv"
[ "$1" = "--test-only" ] || { echo "queued for real" >&2; exit 9; }
if grep -q -- "--partition=nope" "$2"; then
  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2; exit 1
fi
echo "sbatch: Job 77 to start at 2026-11-29T20:00:00 using 1 processors on nodes n1 in partition debug" >&2
"""


def test_test_only_asks_sbatch_for_every_job_and_queues_nothing(runner, tmp_path: Path, fake_slurm: Path):
    (tmp_path / "bin" / "sbatch").write_text(TEST_ONLY_SBATCH)
    exp = tmp_path / "fake.toml"
    exp.write_text(
        SWEEP + '[[sweep.points]]\nname = "good"\n[[sweep.points]]\nname = "bad"\n"slurm.partition" = "nope"\n'
    )
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp), "--test-only"])
    assert result.exit_code == 1
    calls = (fake_slurm / "argv").read_text().splitlines()
    assert len(calls) == 6 and all(c.startswith("--test-only ") for c in calls)  # 3 seeds x 2 points
    lines = result.output.splitlines()
    assert sum("accepted: sbatch: Job 77 to start at" in line for line in lines) == 3
    assert sum("REFUSED: sbatch: error" in line for line in lines) == 3
    assert lines[-1].startswith("Error: sbatch --test-only refused 3 of 6; first: ")
    assert "Invalid partition name specified" in lines[-1]
    (run_dir,) = (tmp_path / "runs" / "fake").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dry_run"] is True and not any(j["job_id"] for j in manifest["jobs"])
