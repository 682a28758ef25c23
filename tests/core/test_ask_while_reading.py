"""Slurm asked before the records are read: squeue answers before a status, summary or report reads the
jobs' records (no record read predates its answer), and sacct, started before them, answers while they
are read; the answers decide the states and the usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobgen.cli import main
from tests.data.summary import synth


def _ended_run(root: Path, kept_usage: bool = False) -> Path:
    run = synth.write_run(root, "exp", [synth.FakeJob(f"job{i}", state="COMPLETED", test_acc=0.5) for i in range(5)])
    if kept_usage:  # an earlier summary kept one job's final usage: the question is told after the states
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["jobs"][0]["usage"] = {"key": "stale", "attempts": {}}
        (run / "manifest.json").write_text(json.dumps(manifest))
    return run


@pytest.mark.parametrize("kept_usage", [False, True])
def test_the_accounting_is_asked_while_the_records_are_read(
    runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_usage: bool
) -> None:
    """The first summary of an ended sweep asks sacct its one question while it reads the records (the
    question is every submitted job's), and takes that answer; once some usage is kept, the question
    depends on the states, and is asked after them, once."""
    import threading

    from jobgen.backends._base import Attempt
    from jobgen.results import collect

    run = _ended_run(tmp_path, kept_usage)
    asked, calls = threading.Event(), []
    real_look = collect.look_at_records

    def look(runs, also=None):
        rest = real_look(runs, also)

        def finish():
            rest()
            # Not asked by now: asked after the records were read.
            calls.append(("records read", asked.wait(10 if not kept_usage else 0.3)))

        return finish

    def usage_later(ids):
        calls.append(("sacct", sorted(ids)))  # started (before the reading, where it is asked ahead)

        def answer():
            asked.set()
            return {i: [Attempt(True, 100, 3600, 8, 2, None, final=True)] for i in ids}

        return answer

    monkeypatch.setattr(collect, "look_at_records", look)
    monkeypatch.setattr("jobgen.backends._slurm.usage_later", usage_later)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    ids = ["4000", "4001", "4002", "4003", "4004"]
    if kept_usage:
        assert calls == [("records read", False), ("sacct", ids)]
    else:
        assert calls == [("sacct", ids), ("records read", True)]
    rows = json.loads(result.stdout)["rows"]
    assert [row["gpu_hours"] for row in rows] == [round(2 * 100 / 3600, 6)] * 5, rows  # the answer taken


def test_the_rows_are_built_while_the_accountings_answer_is_on_its_way(
    runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of the first summary, every row but its usage is made before the answer asked ahead is taken;
    each row's usage is the answer's."""
    from jobgen.backends._base import Attempt
    from jobgen.results import collect

    run = _ended_run(tmp_path)
    order: list[str] = []
    real_row = collect._row

    def row(*args, **kwargs):
        order.append("row")
        return real_row(*args, **kwargs)

    def usage_later(ids):
        return lambda: {i: [Attempt(True, 100, 3600, 8, 2, None, final=True)] for i in ids}

    def taken_when_asked_for(work):  # in place of the thread: the answer is there when collect takes it
        return lambda: (order.append("answer taken"), work())[1]

    monkeypatch.setattr(collect, "_row", row)
    monkeypatch.setattr(collect, "in_background", taken_when_asked_for)
    monkeypatch.setattr("jobgen.backends._slurm.usage_later", usage_later)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert order == ["row"] * 5 + ["answer taken"], order
    rows = json.loads(result.stdout)["rows"]
    assert [row["gpu_hours"] for row in rows] == [round(2 * 100 / 3600, 6)] * 5, rows


def _order_of_tools_and_reading(monkeypatch: pytest.MonkeyPatch, reading: Any) -> list[str]:
    """From now on, each Slurm tool started and each start of the records' reading (`reading`: the module
    whose look_at_records the command calls: status, summary and report read through collect's), in
    order."""
    from jobgen.backends import _tools

    order: list[str] = []
    real_start, real_look = _tools._start, reading.look_at_records

    def start(command):
        order.append(f"{command[0]} started")
        return real_start(command)

    def look(runs, also=None):
        rest = real_look(runs, also)

        def read():
            order.append("records read")
            rest()

        return read

    monkeypatch.setattr(_tools, "_start", start)
    monkeypatch.setattr(reading, "look_at_records", look)
    return order


def test_sacct_is_started_before_the_records_are_read_and_answers_the_summary(
    runner, tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first summary's sacct is a process started before the records are read, so its answer comes
    while they are read. Its answer is the summary's usage."""
    from jobgen.results import collect
    from tests.core.conftest import stub_tool

    run = _ended_run(tmp_path)
    lines = "\n".join(
        f"{4000 + i}|2026-01-01T00:00:00|100|60|billing=8,cpu=8,gres/gpu=2,node=1|0|COMPLETED" for i in range(5)
    )
    stub_tool(bin_dir, "sacct", f"cat <<'EOF'\n{lines}\nEOF\n")
    order = _order_of_tools_and_reading(monkeypatch, collect)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert order == ["sacct started", "records read"], order  # one sacct, before the reading
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
