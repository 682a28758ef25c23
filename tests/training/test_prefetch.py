"""`jobgen prefetch` fills the caches a job reads, so the job itself finds its data ready."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobgen.cli import main

JOBGEN = Path(sys.executable).with_name("jobgen")
EXPERIMENT = """
[experiment]
name = "pf"
[launch]
backend = "local"
[train]
model = "builtin:tiny"
accelerator = "cpu"
epochs = 1
num_workers = 0
[data]
dataset = "builtin:synthetic"
partition = [300, 60, 60]
max_length = 32
[sweep.grid]
"train.lr" = [1e-3, 3e-3]
"""


@pytest.mark.training
@pytest.mark.timeout(300)
def test_prefetch_then_the_job_reads_the_cache(tmp_path: Path):
    exp = tmp_path / "pf.toml"
    exp.write_text(EXPERIMENT)
    root = tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [JOBGEN, "--output-root", str(root), "prefetch", str(exp)], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Two jobs differ only in lr: one data preparation serves both.
    assert (
        done.stdout.count("(tokenized now)") == 1
        and "prefetched 1 model/data combination(s) for 2 job(s)" in done.stdout
    )
    assert any((root / ".cache" / "tokenized").iterdir())
    assert not (root / "pf").exists()  # prefetching records no run
    job = subprocess.run(
        [JOBGEN, "--output-root", str(root), "submit", str(exp), "--set", "train.epochs=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert job.stdout.count("(from the cache)") == 2 and "(tokenized now)" not in job.stdout, job.stdout


def test_prefetch_without_the_training_stack_says_what_to_install(
    runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    exp = tmp_path / "pf.toml"
    exp.write_text(EXPERIMENT)
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "prefetch", str(exp)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "needs transformers" in lines[0] and "pip install 'jobgen[train]'" in lines[0]


def test_prefetch_goes_online_and_runs_the_training_data_step(runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A login shell may carry the job scripts' offline switches; prefetching exists to download."""
    calls = []
    monkeypatch.setattr(
        "jobgen.commands.prefetch.subprocess.run",
        lambda command, env, cwd: calls.append((command, env)) or subprocess.CompletedProcess(command, 0),
    )
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_gated_models")  # passed on in the environment only
    exp = tmp_path / "pf.toml"
    exp.write_text(EXPERIMENT.replace('"train.lr" = [1e-3, 3e-3]', '"train.seed" = [1, 2]'))
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "prefetch", str(exp)])
    assert result.exit_code == 0, result.output
    assert len(calls) == 2  # the seed changes the data split: one preparation each
    for command, env in calls:
        assert command[1:4] == ["-u", "-m", "training"] and command[-1] == "--prepare-only"
        assert not {"HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"} & set(env)
        assert env["HF_TOKEN"] == "hf_secret_for_gated_models"
