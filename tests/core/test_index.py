"""The run's index (jobgen.record.index, index.sqlite): what was read of each record, used only while
the record's stamp and the reading code's fingerprint are those it was kept with. A record replaced,
rewritten in place, made or removed is read again; edited reading code reads everything again; a
deleted, truncated, garbage or locked index costs time, never an answer, and is written sound again."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.record import index as index_module
from jobgen.record.damage import JOB_FILES
from jobgen.record.index import INDEX, stamp
from jobgen.record.model import Run
from tests.data.summary import synth

PAST = time.time() - 60


def _settle(run: Path) -> None:
    """Every job file and folder as if written a minute ago: old enough for what is read of it to be kept."""
    for path in sorted((run / "jobs").rglob("*"), reverse=True):
        os.utime(path, (PAST, PAST))
    os.utime(run / "jobs", (PAST, PAST))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    jobs = [synth.FakeJob(f"job{i}", sweep={"train.lr": i}, state="COMPLETED", test_acc=0.5 + i / 10) for i in range(3)]
    folder = synth.write_run(tmp_path / "runs", "exp", jobs)
    _settle(folder)
    return folder


def _summary(runner, run: Path) -> dict[str, float]:
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    return {row["config"]: row["test_acc"] for row in rows}


def _status(runner, run: Path) -> tuple[list[str], list[str]]:
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "status", str(run)])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[2:], [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]


def _rewrite(path: Path, doc: dict, *, in_place: bool = False) -> None:
    """As a job writes a record (a new file renamed into place), or as a hand edits one (in place)."""
    text = json.dumps(doc)
    if in_place:
        with open(path, "r+", encoding="utf-8") as fh:
            fh.write(text)
            fh.truncate()
    else:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def _no_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.results import collect

    def refuse(*_a, **_k):
        raise AssertionError("a settled result.json was read again")

    for name in ("result_fields", "_document"):
        monkeypatch.setattr(collect, name, refuse)


def test_a_settled_result_is_not_read_again(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _summary(runner, run)
    assert first == {"job0": 0.5, "job1": 0.6, "job2": 0.7}
    _no_reading(monkeypatch)
    assert _summary(runner, run) == first


def test_the_first_status_keeps_the_results_numbers_for_the_summary(
    runner, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first status's damage check parses every result.json: it keeps their numbers, and the summary
    after it reads none of them again."""
    rows, warnings = _status(runner, run)
    assert len(rows) == 3 and not warnings
    _no_reading(monkeypatch)
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}


def test_a_status_slurm_answered_keeps_what_the_summary_reads(
    tmp_path: Path, runner, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs the controller still holds as ended: the first status records Slurm's word and keeps the
    results' numbers and what each spec asked for; the summary after it parses no result.json and no
    spec.json (10,000 of each at a sweep's end)."""
    from jobgen.results import cost
    from tests.core.conftest import stub_tool

    jobs = [synth.FakeJob(f"job{i}", sweep={"train.lr": i}, state="RUNNING", test_acc=0.5 + i / 10) for i in range(3)]
    run = synth.write_run(tmp_path / "runs", "exp", jobs)
    _settle(run)
    said = "".join(f"{4000 + i}|COMPLETED|0:09|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:09|0|\\n" for i in range(3))
    stub_tool(bin_dir, "squeue", f"printf '{said}'\n")
    stub_tool(bin_dir, "sacct", "exit 0\n")
    rows, warnings = _status(runner, run)
    assert [row.split()[3] for row in rows] == ["COMPLETED"] * 3 and not warnings, rows
    _no_reading(monkeypatch)

    def refuse(*_a, **_k):
        raise AssertionError("a settled spec.json was read again")

    monkeypatch.setattr(cost, "_read_asked", refuse)
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}


def test_the_summary_parses_each_result_once(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The damage check and the result's fields read the one document parsed of each result.json."""
    from jobgen.results import collect

    def refuse(*_a, **_k):
        raise AssertionError("a result.json was parsed a second time")

    monkeypatch.setattr(collect, "_document", refuse)
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}


@pytest.mark.parametrize("in_place", [False, True], ids=["replaced", "rewritten in place"])
def test_a_changed_result_is_read_again(runner, run: Path, in_place: bool) -> None:
    path = run / "jobs" / "job1" / "result.json"
    doc = json.loads(path.read_text())
    _rewrite(path, doc)
    _settle(run)
    assert _summary(runner, run)["job1"] == 0.6
    size = path.stat().st_size
    _rewrite(path, {**doc, "test_acc": 0.9}, in_place=in_place)
    assert path.stat().st_size == size  # the same size
    os.utime(path, (PAST, PAST))  # and the old mtime: the ctime and (replaced) the inode differ
    assert _summary(runner, run)["job1"] == 0.9


def test_a_result_damaged_after_it_was_kept_is_named(runner, run: Path) -> None:
    _summary(runner, run)
    path = run / "jobs" / "job2" / "result.json"
    path.write_bytes(path.read_bytes()[:20])
    _settle(run)
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "summary", str(run)])
    assert "jobs/job2/result.json: truncated" in result.stderr, result.output
    assert _summary(runner, run)["job2"] is None


def test_a_record_made_or_removed_in_a_kept_folder_is_seen(runner, run: Path) -> None:
    """A record absent before is seen once made, and one removed is missed, whatever the index kept."""
    rows, _ = _status(runner, run)
    assert all(" - " in row for row in rows)  # no retries.json yet
    retries = {"schema": 1, "retries": 1, "limit": 2, "excluded": ["n7"], "stopped": None}
    (run / "jobs" / "job0" / "retries.json").write_text(json.dumps(retries))
    _settle(run)  # the folder's mtime put back: its ctime still moved
    rows, _ = _status(runner, run)
    assert "1/2 excl n7" in rows[0], rows
    (run / "jobs" / "job0" / "result.json").unlink()
    _settle(run)
    rows, _ = _status(runner, run)
    assert "FAILED" in rows[0] and "COMPLETED" in rows[1], rows  # ended without its result


@pytest.mark.parametrize("name", ["result.json", "spec.json"])
def test_a_record_cut_short_in_place_in_an_unchanged_folder_is_named(runner, run: Path, name: str) -> None:
    """A record rewritten in place leaves its folder's stamp as it was: the record's own stamp is what
    tells the damage check to look at it again."""
    _, warnings = _status(runner, run)
    assert not warnings
    folder = run / "jobs" / "job2"
    before = os.stat(folder)
    with open(folder / name, "r+b") as fh:  # a full disk, or a hand: the same inode, cut short
        fh.truncate(20)
    after = os.stat(folder)
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
    _, warnings = _status(runner, run)
    assert len(warnings) == 1 and f"/jobs/job2/{name}: truncated or not JSON" in warnings[0], warnings


def test_a_file_replaced_while_it_is_read_is_kept_as_the_version_read(run: Path) -> None:
    """A writer that replaces a record between the stat and the read: what was read is kept under the
    stamp of the version read, never under the one stat'ed before it."""
    loaded = Run.load(run)
    job = loaded.jobs[0]
    path = run / "jobs" / "job0" / "result.json"
    before = job._stat("result.json")
    _rewrite(path, {**json.loads(path.read_text()), "test_acc": 0.25})
    os.utime(path, (PAST, PAST))
    from jobgen.results.collect import result_of

    result, _ = result_of(job)
    assert result is not None and result.test_acc == 0.25
    loaded.save_index()
    assert _rows(run)["jobs/job0/result.json"][0] == stamp(os.stat(path)) != before


def test_a_settled_run_is_read_from_the_index(runner, run: Path, monkeypatch) -> None:
    """The first status opens each job's records (spec.json and result.json here); the next one opens
    none of them (what was read of them is in the index, their stamps unchanged) and shows the same."""
    from jobgen.record import model

    opens: list[str] = []
    real_read = model.read_with_stamp
    monkeypatch.setattr(model, "read_with_stamp", lambda path: opens.append(path) or real_read(path))

    def records(paths: list[str]) -> list[str]:
        return sorted(Path(p).name for p in paths if "/jobs/job" in p and Path(p).name in JOB_FILES)

    rows, warnings = _status(runner, run)
    assert len(rows) == 3 and not warnings
    assert records(opens) == ["result.json"] * 3 + ["spec.json"] * 3, opens
    del opens[:]
    rows_again, warnings = _status(runner, run)
    assert rows_again == rows and not warnings
    assert records(opens) == [], opens


def test_the_cli_gives_an_in_process_caller_its_garbage_collector_back(runner, run: Path) -> None:
    import gc

    assert gc.isenabled()
    _status(runner, run)
    assert gc.isenabled()
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "status", "no-such-run"])
    assert result.exit_code != 0 and gc.isenabled()


def test_a_new_log_is_found(run: Path) -> None:
    """A job's logs are found among the other files of its folder, and a log made after a command read
    the run (a requeued job's new one) is found by the next."""
    from jobgen.results import logs

    folder = run / "jobs" / "job1"
    (folder / "slurm-4001.out").write_text("step 1\n")
    (folder / "notes.txt").write_text("mine\n")
    (folder / "checkpoints").mkdir()
    _settle(run)

    def read() -> list[str]:
        loaded = Run.load(run)
        job = next(j for j in loaded.jobs if j.name == "job1")
        job.problems()
        found = [path.name for path in logs.of(job, loaded.backend)]
        loaded.save_index()
        return found

    assert read() == ["slurm-4001.out"]
    assert read() == ["slurm-4001.out"]
    (folder / "slurm-4002.out").write_text("again\n")
    assert sorted(read()) == ["slurm-4001.out", "slurm-4002.out"]


def _rows(run: Path) -> dict[str, tuple[str, str, dict]]:
    """What the index keeps of each record: path -> (stamp, code fingerprint, what was read, by key).
    The keys of one record kept by one command share its stamp and code."""
    out: dict[str, tuple[str, str, dict]] = {}
    with contextlib.closing(sqlite3.connect(run / INDEX)) as db:
        for record, key, mark, code, value in db.execute("SELECT record, key, stamp, code, value FROM facts"):
            held = out.setdefault(record, (mark, code, {}))
            assert held[:2] == (mark, code), (record, key)
            held[2][key] = None if value is None else json.loads(value)
    return out


def _sound(run: Path) -> bool:
    with contextlib.closing(sqlite3.connect(run / INDEX)) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok" and bool(_rows(run))


def _report(runner, run: Path, out: Path) -> None:
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "report", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output


def test_after_status_summary_and_report_the_folder_holds_the_records_the_manifest_and_one_index(
    runner, run: Path, tmp_path: Path
) -> None:
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    rows, warnings = _status(runner, run)
    assert len(rows) == 3 and not warnings
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}
    _report(runner, run, tmp_path / "r.html")
    after = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    assert sorted([*before, INDEX]) == after, after
    assert "manifest.json" in after and all(f"jobs/job{i}/result.json" in after for i in range(3))
    assert _sound(run)


def test_the_index_keeps_what_was_read_by_stamp_and_code(runner, run: Path) -> None:
    _status(runner, run)
    rows = _rows(run)
    path = run / "jobs" / "job1" / "result.json"
    mark, code, facts = rows["jobs/job1/result.json"]
    assert mark == stamp(os.stat(path)) and code == index_module.fingerprint()
    assert facts["problem"] is None and facts["result"]["test_acc"] == 0.6
    assert {rel for rel in rows if rel.startswith("jobs/job1/")} == {"jobs/job1/result.json", "jobs/job1/spec.json"}
    with contextlib.closing(sqlite3.connect(run / INDEX)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # never WAL: network file systems


def _damage(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "deleted":
        path.unlink()
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "cut short":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "garbage":
        path.write_bytes(random.Random(3).randbytes(len(raw)))
    elif how == "garbage after its header":
        path.write_bytes(raw[:100] + random.Random(4).randbytes(len(raw) - 100))


@pytest.mark.parametrize("how", ["deleted", "empty", "cut short", "garbage", "garbage after its header"])
def test_a_damaged_index_costs_time_not_answers_and_is_written_again(runner, run: Path, how: str, tmp_path) -> None:
    good = _summary(runner, run)
    rows, _ = _status(runner, run)
    _damage(run / INDEX, how)
    assert _summary(runner, run) == good
    assert _status(runner, run) == (rows, [])
    _report(runner, run, tmp_path / "r.html")
    assert _sound(run) and "jobs/job2/result.json" in _rows(run)
    assert sorted(p.name for p in run.iterdir()) == [INDEX, "jobs", "manifest.json"]  # no temp left


def test_an_index_of_another_layout_is_read_around_and_the_facts_kept_beside_it(runner, run: Path) -> None:
    """An index.sqlite an earlier jobgen wrote (another table, no `facts`): nothing of it is taken, the
    answers are the records', and what this command read is kept in `facts`."""
    with contextlib.closing(sqlite3.connect(run / INDEX)) as db:
        db.execute("CREATE TABLE folders (folder TEXT PRIMARY KEY, code TEXT NOT NULL, read BLOB NOT NULL)")
        db.execute("INSERT INTO folders VALUES ('jobs/job0', ?, '{}')", (index_module.fingerprint(),))
        db.commit()
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}
    rows, warnings = _status(runner, run)
    assert len(rows) == 3 and warnings == []
    kept = _rows(run)
    assert kept["jobs/job1/result.json"][2]["result"]["test_acc"] == 0.6 and _sound(run)


def test_what_other_code_read_is_read_again(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows kept by another fingerprint (edited reading code), even with this code's stamps: not taken."""
    _summary(runner, run)
    with contextlib.closing(sqlite3.connect(run / INDEX)) as db:
        for record, value in db.execute("SELECT record, value FROM facts WHERE key = 'result'").fetchall():
            result = {**json.loads(value), "test_acc": 0.01}  # what the other code read
            db.execute("UPDATE facts SET value = ? WHERE record = ? AND key = 'result'", (json.dumps(result), record))
        db.execute("UPDATE facts SET code = 'other'")
        db.commit()
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}
    assert {code for _, code, _ in _rows(run).values()} == {index_module.fingerprint()}  # written by this code


def test_edited_code_reads_the_records_again(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.results import collect

    _summary(runner, run)
    read: list[object] = []
    real = collect.result_fields
    monkeypatch.setattr(collect, "result_fields", lambda doc: read.append(doc) or real(doc))
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7} and read == []
    monkeypatch.setattr(index_module, "fingerprint", lambda: "edited")
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7} and len(read) == 3


def test_the_fingerprint_is_of_the_source(tmp_path: Path) -> None:
    """Once per process, from jobgen's sources: the same in another process, and a hex digest."""
    import subprocess
    import sys

    other = subprocess.run(
        [sys.executable, "-c", "from jobgen.record.index import fingerprint; print(fingerprint())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert other == index_module.fingerprint() and len(other) == 32 and int(other, 16) >= 0


def test_values_of_the_wrong_shape_cost_time_not_answers(runner, run: Path) -> None:
    good = _summary(runner, run)
    wrong = {"result": [1, 2], "problem": 3, "retries": [1], "asked": "x"}
    with contextlib.closing(sqlite3.connect(run / INDEX)) as db:
        for key, value in wrong.items():  # this version's stamps, values of the wrong shape
            db.execute(
                "UPDATE facts SET value = ? WHERE record LIKE 'jobs/job0/%' AND key = ?", (json.dumps(value), key)
            )
        db.execute("UPDATE facts SET value = '{not json' WHERE record LIKE 'jobs/job1/%'")
        db.execute("UPDATE facts SET stamp = 5, value = x'ff00' WHERE record LIKE 'jobs/job2/%'")  # not text
        db.commit()
    assert _summary(runner, run) == good
    rows, warnings = _status(runner, run)
    assert warnings == [] and all("COMPLETED" in row for row in rows), rows


def test_a_locked_index_is_read_around(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holds the index's write lock (a long write, a stuck NFS lock): the command waits
    a moment, then reads the records themselves and keeps nothing; it never fails on the lock."""
    good = _summary(runner, run)
    monkeypatch.setattr(index_module, "BUSY_MS", 50)
    holder = sqlite3.connect(run / INDEX, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert _summary(runner, run) == good
        rows, warnings = _status(runner, run)
        assert not warnings and all("COMPLETED" in row for row in rows)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert _sound(run)


def _command(root: str, run: str, command: str, rounds: int, out: str) -> None:
    """`command` of the run `rounds` times, through the functions the CLI calls (CliRunner swaps the
    process's stdout: not for threads), each answer checked."""
    from jobgen.results.report import report_page
    from jobgen.results.status_view import read_status
    from jobgen.results.summary import summary_text

    for n in range(rounds):
        if command == "summary":
            text, warnings = summary_text([Path(run)], fmt="json")
            accs = {row["config"]: row["test_acc"] for row in json.loads(text)["rows"]}
            assert accs == {"job0": 0.5, "job1": 0.6, "job2": 0.7} and not warnings, accs
        elif command == "status":
            view = read_status(Path(run))
            assert [row[3] for row in view.rows] == ["COMPLETED"] * 3 and not view.warnings, view
        else:
            page = report_page([Path(run)], Path(f"{out}-{n}.html")).read_text()
            assert all(f"job{i}" in page for i in range(3))


@pytest.mark.parametrize("way", ["threads", "processes"])
def test_commands_reading_one_run_at_once_all_answer_right(run: Path, tmp_path: Path, way: str) -> None:
    """status, summary and report of one run at once, each writing the index when it is done: every one
    answers right, and the index is sound after."""
    args = [
        (str(run.parent.parent), str(run), c, 4, str(tmp_path / f"{c}{k}"))
        for c in ("status", "summary", "report")
        for k in range(2)
    ]
    os.utime(run / "manifest.json", (PAST, PAST))
    if way == "threads":
        failed: list[BaseException] = []

        def work(*a: object) -> None:
            try:
                _command(*a)  # type: ignore[arg-type]
            except BaseException as exc:
                failed.append(exc)

        threads = [threading.Thread(target=work, args=a) for a in args]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failed, failed
    else:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_command, args=a) for a in args]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
            assert proc.exitcode == 0
    assert _sound(run)
    assert not [p for p in run.iterdir() if p.name not in (INDEX, "jobs", "manifest.json")]
