"""`jobgen clean`: only completed jobs lose their checkpoints, and only with --yes."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobgen.cli import main
from tests.core.conftest import fake_squeue
from tests.data.summary.synth import FakeJob, write_run


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_squeue(monkeypatch, lambda ids: {})  # Slurm knows nothing: the files decide
    jobs = [FakeJob("done"), FakeJob("broken", state="FAILED", result=None), FakeJob("bare")]
    run_dir = write_run(tmp_path / "runs", "exp", jobs)
    for name, size in (("done", 3000), ("broken", 5000)):
        folder = run_dir / "jobs" / name / "checkpoints"
        folder.mkdir()
        (folder / "last.ckpt").write_bytes(b"x" * size)
    return run_dir


def test_lists_then_deletes_only_completed_jobs_checkpoints(runner, run: Path):
    root = ["--output-root", str(run.parents[1])]
    listed = runner.invoke(main, [*root, "clean", "exp"])
    assert listed.exit_code == 0, listed.output
    assert str(run / "jobs" / "done" / "checkpoints") in listed.output and "broken" not in listed.output
    assert "would free 2.9 KB from 1 job(s)" in listed.output
    assert (run / "jobs" / "done" / "checkpoints" / "last.ckpt").exists()  # a listing deletes nothing

    done = runner.invoke(main, [*root, "clean", "exp", "--yes"])
    assert done.exit_code == 0 and "freed 2.9 KB from 1 job(s)" in done.output
    assert not (run / "jobs" / "done" / "checkpoints").exists()
    assert (run / "jobs" / "done" / "result.json").exists()
    assert (run / "jobs" / "broken" / "checkpoints" / "last.ckpt").exists()  # requeue resumes from it
    again = runner.invoke(main, [*root, "clean", "exp", "--yes"])
    assert "nothing to clean" in again.output
