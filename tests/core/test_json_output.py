"""`--format json` is JSON: every command that takes it prints one JSON document alone on stdout, and
everything else (a local job's training output, progress, notes, warnings) goes to stderr.

The commands: probe, summary, diff (`test_every_json_command_is_here` finds them in the CLI). The probe
runs a real tiny job with the local backend, whose output the backend copies as it comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from jobgen.cli import main
from tests.data.summary.synth import FakeJob, write_run

TINY = """
[experiment]
name = "tiny"

[launch]
backend = "local"

[train]
engine = "torch"
model = "builtin:tiny"
accelerator = "cpu"
epochs = 1
batch_size = 16
num_workers = 0

[data]
dataset = "builtin:synthetic"
partition = [64, 32, 32]
max_length = 16
"""
JSON_COMMANDS = {"probe", "summary", "diff"}


def test_every_json_command_is_here() -> None:
    """The commands with a --format choice of json, read from the CLI: a new one needs a test below."""
    found = {
        name
        for name, command in main.commands.items()
        for param in command.params
        if isinstance(param.type, click.Choice) and "json" in param.type.choices and "--format" in param.opts
    }
    assert found == JSON_COMMANDS


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`jobgen probe tiny.toml --format json` run as a user runs it: the installed script, its own stdout."""
    folder = tmp_path_factory.mktemp("json-probe")
    (folder / "tiny.toml").write_text(TINY)
    script = Path(sys.executable).parent / "jobgen"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = ["--output-root", str(folder / "runs"), "probe", str(folder / "tiny.toml"), "--format", "json"]
    args += ["--steps", "2", "--warmup-steps", "1", "--eval-samples", "16", "--interval", "0.2"]
    done = subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, folder / "runs"


def test_probe_on_the_local_backend(probed: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, _ = probed
    (point,) = json.loads(done.stdout)
    assert point["name"] == "tiny" and point["state"] == "COMPLETED"
    assert point["samples_per_s"] > 0 and point["predicted_wall_s"] > 0
    # The job's own output still reaches the terminal, on stderr: it was what broke `| jq`.
    assert "training: wrote" in done.stderr and "probe.json" in done.stderr
    assert "probe run: " in done.stderr and "training:" not in done.stdout


def test_summary_and_diff_of_real_local_runs(runner, probed: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, root = probed
    (ran,) = (root / "tiny").iterdir()
    dry = runner.invoke(main, ["--output-root", str(root), "submit", str(root.parent / "tiny.toml"), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    (dry_run,) = (p for p in (root / "tiny").iterdir() if p != ran)

    summary = runner.invoke(main, ["--output-root", str(root), "summary", str(ran), "--format", "json"])
    assert summary.exit_code == 0, summary.output
    (row,) = json.loads(summary.stdout)["rows"]
    assert row["config"] == "tiny" and row["state"] == "COMPLETED" and row["samples_per_s"] > 0

    diff = runner.invoke(main, ["--output-root", str(root), "diff", str(ran), str(dry_run), "--format", "json"])
    assert diff.exit_code == 0, diff.output
    doc = json.loads(diff.stdout)
    assert doc["not_run"] == {"a": None, "b": "a dry run, none of its jobs ran"}
    assert doc["results"][0]["state"] == ["COMPLETED", "DRY_RUN"]


@pytest.mark.parametrize("backend", ["sbatch", "local"])
def test_summary_and_diff_keep_warnings_and_notes_off_stdout(runner, tmp_path: Path, backend: str) -> None:
    """Damaged records and an old run's note are printed too, on stderr; stdout parses as it is."""
    logs = {"local.out": "ok\n"} if backend == "local" else {}
    runs = [
        write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", logs=logs), FakeJob("b", logs=logs)], run_id=i)
        for i in ("20261129-200000-aaaa", "20261129-210000-bbbb")
    ]
    for run in runs:
        (run / "experiment.toml").write_text("[train]\nepochs = 1\n")  # no resolved experiment: a note
    (runs[1] / "jobs" / "a" / "result.json").write_text('{"schema": 1, "tim')
    for args in (["summary", *map(str, runs), "--format", "json"], ["diff", *map(str, runs), "--format", "json"]):
        result = runner.invoke(main, ["--output-root", str(tmp_path), *args])
        assert result.exit_code == 0, result.output
        assert isinstance(json.loads(result.stdout), dict)
        assert "warning:" in result.stderr and "result.json" in result.stderr
    assert "note: A was recorded before runs kept experiment.resolved.toml" in result.stderr
