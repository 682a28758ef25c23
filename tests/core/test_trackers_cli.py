"""train.loggers on the jobgen side: the key is checked before submit, both schemas agree, `jobgen sync`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.cli import main
from tests.core.test_bad_input import with_lines
from training import spec as training_spec


def test_loggers_reach_the_spec(tmp_path: Path, runner) -> None:
    exp = tmp_path / "e.toml"
    exp.write_text(with_lines(train='loggers = ["csv", "tensorboard", "mlflow"]\nmlflow_uri = "http://mlflow:5000"'))
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp), "--dry-run"])
    assert done.exit_code == 0, done.output
    (spec_path,) = (tmp_path / "runs").glob("bad/*/jobs/*/spec.json")
    spec = training_spec.load(spec_path)
    assert spec.train.loggers == ["csv", "tensorboard", "mlflow"] and spec.train.mlflow_uri == "http://mlflow:5000"
    assert spec.train.wandb_mode == "offline"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('loggers = ["csv", "tensorbord"]', ["train.loggers", "'tensorbord'", "did you mean 'tensorboard'"]),
        ('loggers = "wandb"', ["train.loggers", "expected a list"]),
        ('loggers = ["wandb", "wandb"]', ["train.loggers", "twice"]),
        ('wandb_mode = "offlne"', ["train.wandb_mode", "did you mean 'offline'"]),
    ],
)
def test_bad_loggers_are_one_line_errors(tmp_path: Path, runner, line: str, words: list[str]) -> None:
    exp = tmp_path / "e.toml"
    exp.write_text(with_lines(train=line))
    done = runner.invoke(main, ["validate", str(exp)])
    assert done.exit_code == 1
    assert len(done.output.strip().splitlines()) == 1 and "Traceback" not in done.output
    assert all(w in done.output for w in words), done.output


def _run_with_wandb(root: Path) -> Path:
    run = root / "exp" / "20261201-000000-ab12"
    jobs = []
    for name in ("a", "b"):
        (run / "jobs" / name / "wandb" / f"offline-run-20261201_000000-{name * 8}").mkdir(parents=True)
        jobs.append({"name": name, "dir": f"jobs/{name}", "state": "COMPLETED"})
    (run / "jobs" / "c").mkdir()
    jobs.append({"name": "c", "dir": "jobs/c", "state": "COMPLETED"})
    (run / "manifest.json").write_text(
        json.dumps({"schema": 1, "run_id": run.name, "experiment": "exp", "backend": "sbatch", "jobs": jobs})
    )
    return run


def test_sync_hands_every_offline_run_to_wandb_sync(tmp_path: Path, runner, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run_with_wandb(tmp_path / "runs")
    bin_dir, record = tmp_path / "bin", tmp_path / "argv.json"
    bin_dir.mkdir()
    fake = bin_dir / "wandb"  # stands in for W&B's own command: records what it was asked to do
    fake.write_text(
        f"#!/bin/sh\n{__import__('sys').executable} -c 'import json, os, sys; "
        f'json.dump([sys.argv[1:], os.environ.get("WANDB_API_KEY")], open("{record}", "w"))\' "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "sync", "exp"])
    assert done.exit_code == 0, done.output
    assert "synced 2 W&B run(s)" in done.output
    argv, key = json.loads(record.read_text())
    assert argv == ["sync", *(str(p) for p in sorted(run.glob("jobs/*/wandb/offline-run-*")))]
    assert key == "k" * 40 and not any("k" * 40 in a for a in argv)  # from the environment, never the command line


def test_sync_without_offline_runs_says_why(tmp_path: Path, runner) -> None:
    run = _run_with_wandb(tmp_path / "runs")
    for folder in run.glob("jobs/*/wandb"):
        for child in folder.iterdir():
            child.rmdir()
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "sync", "exp"])
    assert done.exit_code == 1 and "no offline W&B runs" in done.output and "train.loggers" in done.output
