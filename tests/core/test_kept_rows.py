"""What `jobgen status` keeps of a run whose jobs have all ended (jobgen.record.rows, `.rows-status.json`):
its rows, shown again without reading the run while neither the manifest nor any job's folder or
record changed. Each way a run changes makes the next status read it again; a broken cache, another
jobgen version or a job that may still change keeps nothing from being read."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.record import rows, store
from jobgen.record.model import Run
from jobgen.results import status
from tests.data.summary import synth

PAST = time.time() - 60
ROWS = ".rows-status.json"
RETRIES = {"schema": 1, "retries": 1, "limit": 2, "excluded": ["n7"], "stopped": None}


def _settle(*paths: Path) -> None:
    """These job files, and their folders, as if written a minute ago: old enough to be kept. Only
    these: setting a file's times moves its ctime (the manifest is known by its bytes)."""
    for path in paths:
        os.utime(path, (PAST, PAST))
        if path.is_file():
            os.utime(path.parent, (PAST, PAST))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    jobs = [synth.FakeJob(f"job{i}", sweep={"train.lr": i}, state="COMPLETED") for i in range(3)]
    folder = synth.write_run(tmp_path / "runs", "exp", jobs)
    _settle(*sorted((folder / "jobs").rglob("*"), reverse=True))
    return folder


def _status(runner, run: Path, *more: str) -> tuple[list[str], list[str]]:
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "status", str(run), *more])
    assert result.exit_code == 0, result.output
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]
    return result.stdout.splitlines()[2:], warnings


def _not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("the run was read although nothing changed")

    monkeypatch.setattr(Run, "load", refuse)


def _kept(runner, run: Path) -> bool:
    """Whether status shows the run from its kept rows now (and with what it would read otherwise)."""
    view = status.read_status(run)
    return view.kept


def test_an_ended_run_is_shown_from_its_kept_rows(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _status(runner, run)
    assert (run / ROWS).exists()
    with monkeypatch.context() as m:
        _not_read(m)
        assert _status(runner, run) == first


def test_the_kept_rows_hold_the_warnings_too(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = run / "jobs" / "job1" / "spec.json"
    spec.write_bytes(spec.read_bytes()[:10])
    _settle(spec)
    first = _status(runner, run)
    assert any("jobs/job1/spec.json: truncated" in ln for ln in first[1]), first
    with monkeypatch.context() as m:
        _not_read(m)
        assert _status(runner, run) == first


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _in_place(path: Path, text: str) -> None:
    with open(path, "r+", encoding="utf-8") as fh:
        fh.write(text)
        fh.truncate()


def test_a_record_rewritten_in_place_is_read_again(runner, run: Path) -> None:
    path = run / "jobs" / "job0" / "retries.json"
    path.write_text(json.dumps(RETRIES))
    _settle(path)
    rows_, _ = _status(runner, run)
    assert "1/2 excl n7" in rows_[0]
    assert _kept(runner, run)
    size = path.stat().st_size
    _in_place(path, json.dumps({**RETRIES, "excluded": ["n8"]}))  # the same size, the old mtime: the ctime moved
    os.utime(path, (PAST, PAST))
    assert path.stat().st_size == size
    rows_, _ = _status(runner, run)
    assert "1/2 excl n8" in rows_[0], rows_


def test_a_record_replaced_is_read_again(runner, run: Path) -> None:
    _status(runner, run)
    path = run / "jobs" / "job2" / "spec.json"
    _replace(path, "{not json")
    _settle(path)  # the folder's mtime put back: its ctime, and the file's inode, moved
    _, warnings = _status(runner, run)
    assert any("jobs/job2/spec.json: truncated or not JSON" in ln for ln in warnings), warnings


def test_a_record_made_or_removed_is_seen(runner, run: Path) -> None:
    _status(runner, run)
    (run / "jobs" / "job1" / "retries.json").write_text(json.dumps(RETRIES))
    _settle(run / "jobs" / "job1" / "retries.json")  # the folder's mtime put back: its ctime moved
    rows_, _ = _status(runner, run)
    assert "1/2 excl n7" in rows_[1], rows_
    assert _kept(runner, run)
    (run / "jobs" / "job1" / "result.json").unlink()
    _settle(run / "jobs" / "job1")
    rows_, _ = _status(runner, run)
    assert "FAILED" in rows_[1] and "COMPLETED" in rows_[0], rows_  # ended without its result


def test_a_job_folder_removed_is_seen(runner, run: Path) -> None:
    _status(runner, run)
    for path in sorted((run / "jobs" / "job0").rglob("*"), reverse=True):
        path.unlink()
    (run / "jobs" / "job0").rmdir()
    _, warnings = _status(runner, run)
    assert any("jobs/job0/: the job's folder is missing" in ln for ln in warnings), warnings


def test_a_changed_manifest_is_read_again(runner, run: Path) -> None:
    _status(runner, run)
    # A change of the record, in the journal (as a command writes it), and after it is folded in.
    store.update_jobs(run, {"job1": {"elapsed": "00:07:00"}})
    rows_, _ = _status(runner, run)
    assert "00:07:00" in rows_[1], rows_
    store.compact(run)
    assert _status(runner, run)[0] == rows_
    assert _kept(runner, run)
    doc = json.loads((run / "manifest.json").read_text())
    doc["jobs"][2]["elapsed"] = "00:09:00"
    (run / "manifest.json").write_text(json.dumps(doc))  # by hand, in place
    rows_, _ = _status(runner, run)
    assert "00:09:00" in rows_[2], rows_


def test_a_journal_line_beside_an_unchanged_manifest_is_read(runner, run: Path) -> None:
    _status(runner, run)
    assert _kept(runner, run)
    read = store.read_manifest(run)
    (run / read.journal).write_text(json.dumps({"key": "jobs", "updates": {"job0": {"elapsed": "00:05:00"}}}) + "\n")
    assert not _kept(runner, run)
    assert "00:05:00" in status.read_status(run).rows[0][4]


def test_a_job_that_may_still_change_keeps_nothing(runner, run: Path, bin_dir: Path) -> None:
    from tests.core.conftest import stub_tool

    for tool in ("sacct", "squeue", "scontrol"):
        stub_tool(bin_dir, tool, "exit 0\n")  # Slurm knows none of them
    doc = json.loads((run / "manifest.json").read_text())
    doc["jobs"][0]["state"] = "RUNNING"
    (run / "manifest.json").write_text(json.dumps(doc))
    (run / "jobs" / "job0" / "result.json").unlink()
    _settle(run / "jobs" / "job0")
    rows_, _ = _status(runner, run)
    assert "UNKNOWN" in rows_[0], rows_  # last seen running, and Slurm no longer knows it
    assert not (run / ROWS).exists()
    # Recorded now as UNKNOWN, which is asked about again: still nothing kept.
    _status(runner, run)
    assert not (run / ROWS).exists()


def test_refresh_reads_the_run(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _status(runner, run)
    with monkeypatch.context() as m:
        _not_read(m)
        with pytest.raises(AssertionError, match="the run was read"):
            status.read_status(run, refresh=True)


def test_records_written_a_moment_ago_are_not_kept(runner, run: Path) -> None:
    (run / "jobs" / "job1" / "retries.json").write_text(json.dumps(RETRIES))  # now
    _status(runner, run)
    assert not (run / ROWS).exists()
    _settle(run / "jobs" / "job1" / "retries.json")
    _status(runner, run)
    assert (run / ROWS).exists()


@pytest.mark.parametrize("broken", ["garbage", "truncated", "another version", "cells of the wrong shape"])
def test_a_broken_cache_costs_time_not_answers(runner, run: Path, broken: str) -> None:
    good = _status(runner, run)
    path = run / ROWS
    raw = path.read_bytes()
    doc = json.loads(raw)
    if broken == "garbage":
        path.write_bytes(b"\xff\x00{")
    elif broken == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif broken == "another version":
        doc["jobs"][0][3][0][3] = "FAILED"  # what another version showed: not taken for this one's
        path.write_text(json.dumps({**doc, "jobgen": "0.0.1"}))
    else:
        doc["jobs"][0][3] = [["job0"], 3]
        path.write_text(json.dumps(doc))
    assert _status(runner, run) == good


def test_a_run_copied_elsewhere_is_read_again(runner, run: Path, tmp_path: Path) -> None:
    """A copy keeps the bytes and (cp -p) the times, not the inodes."""
    import shutil

    _status(runner, run)
    copy = tmp_path / "copy" / "exp" / run.name
    shutil.copytree(run, copy)
    assert rows.load(copy, status.STATUS) is None
    assert status.read_status(copy).rows == status.read_status(run).rows


def test_a_record_replaced_between_its_stat_and_its_read_keeps_no_stamps(run: Path) -> None:
    """The stamps kept are those first seen, before any read: a record replaced between the two was read
    in another version than the one stat'ed, and nothing of the job is kept."""
    path = run / "jobs" / "job0" / "retries.json"
    path.write_text(json.dumps(RETRIES))
    _settle(path)
    job = Run.load(run).jobs[0]
    job._stat("retries.json")
    _replace(path, json.dumps({**RETRIES, "excluded": ["n9"]}))
    _settle(path)
    assert str(job.retries()) == "1/2 excl n9"
    job.problems()
    assert job.stamps() is None
    again = Run.load(run).jobs[0]
    again.retries()
    again.problems()
    assert again.stamps() is not None


def test_edited_code_reads_the_run_again(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout edited in place keeps its version number: its modules' stamps tell the code apart."""
    _status(runner, run)
    assert _kept(runner, run)
    with monkeypatch.context() as m:
        m.setattr(rows, "code_stamp", lambda: "the stamp of edited modules")
        assert not _kept(runner, run)
    assert not _kept(runner, run)  # kept by the edited code a moment ago: read, and kept again
    assert _kept(runner, run)


def test_the_code_stamp_follows_the_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows.code_stamp.cache_clear()
    before = rows.code_stamp()
    module = Path(status.__file__)
    rows.code_stamp.cache_clear()
    real_stat = os.stat

    def later(path, *a, **k):
        found = real_stat(path, *a, **k)
        if os.fspath(path) == str(module):
            return os.stat_result((*found[:8], found[8] + 1, found[9]))  # mtime one second later
        return found

    monkeypatch.setattr(os, "stat", later)
    try:
        assert rows.code_stamp() != before
    finally:
        monkeypatch.undo()
        rows.code_stamp.cache_clear()
    assert rows.code_stamp() == before
