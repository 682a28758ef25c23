"""Slurm first, then the records: squeue answers before a status, summary or report reads the jobs'
records (no record read predates its answer), and the summary's one sacct question is answered with the
states decided; the answers decide the states and the usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobgen.cli import main
from tests.data.summary import synth


def _order_of_tools_and_reading(monkeypatch: pytest.MonkeyPatch, reading: Any) -> list[str]:
    """From now on, each Slurm tool started and each reading of the records (`reading`: the module whose
    look_at_records the command calls: status, summary and report read through collect's), in order."""
    from jobgen.backends import _tools

    order: list[str] = []
    real_start, real_look = _tools._start, reading.look_at_records

    def start(command):
        order.append(f"{command[0]} started")
        return real_start(command)

    def look(runs, also=None):
        order.append("records read")
        return real_look(runs, also)

    monkeypatch.setattr(_tools, "_start", start)
    monkeypatch.setattr(reading, "look_at_records", look)
    return order


@pytest.mark.parametrize("kept_usage", [False, True])
def test_sacct_is_asked_once_and_answers_the_summary(
    runner, tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch, kept_usage: bool
) -> None:
    """The first summary of an ended sweep asks sacct one question, after the records were read; with one
    job's usage kept (its key stale: asked again) the question is still one. Its answer is the usage."""
    from jobgen.results import collect
    from tests.core.conftest import stub_tool

    run = synth.write_run(
        tmp_path, "exp", [synth.FakeJob(f"job{i}", state="COMPLETED", test_acc=0.5) for i in range(5)]
    )
    if kept_usage:
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["jobs"][0]["usage"] = {"key": "stale", "attempts": {}}
        (run / "manifest.json").write_text(json.dumps(manifest))
    lines = "\n".join(
        f"{4000 + i}|2026-01-01T00:00:00|100|60|billing=8,cpu=8,gres/gpu=2,node=1|0|COMPLETED" for i in range(5)
    )
    stub_tool(bin_dir, "sacct", f"cat <<'EOF'\n{lines}\nEOF\n")
    order = _order_of_tools_and_reading(monkeypatch, collect)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert order == ["records read", "sacct started"], order
    rows = json.loads(result.stdout)["rows"]
    assert [row["gpu_hours"] for row in rows] == [round(2 * 100 / 3600, 6)] * 5, rows


def test_squeue_is_asked_before_the_records_are_read(
    runner, tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status of running jobs asks squeue before it reads the records, and its answer decides the states."""
    from jobgen.results import collect
    from tests.core.conftest import stub_tool

    run = synth.write_run(tmp_path, "exp", [synth.FakeJob(f"job{i}", state="RUNNING", result=None) for i in range(5)])
    ids = [job["job_id"] for job in json.loads((run / "manifest.json").read_text())["jobs"]]
    lines = "\n".join(f"{i}|FAILED|0:09|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:09|256|" for i in ids)
    stub_tool(bin_dir, "squeue", f"cat <<'EOF'\n{lines}\nEOF\n")
    order = _order_of_tools_and_reading(monkeypatch, collect)  # a status reads through collect.look_and_keep
    result = runner.invoke(main, ["status", str(run)])
    assert result.exit_code == 0, result.output
    assert order == ["squeue started", "records read"], order
    manifest = json.loads((run / "manifest.json").read_text())
    assert [job["state"] for job in manifest["jobs"]] == ["FAILED"] * 5  # the answer taken, and recorded
