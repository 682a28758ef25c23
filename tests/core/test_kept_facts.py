"""What a run keeps of its job files between commands (jobgen.record.damage.Verdicts, `.verdicts.json`):
a result's numbers, the damage verdicts, which records a job folder holds, each by the stat stamp of
the version read. A kept fact is used only for that very version: a file replaced, rewritten in place,
made or removed is read again; a broken cache costs time, never a wrong answer; writers replace it
whole, so a reader beside them never reads half of one."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.record import damage
from jobgen.record.model import Run
from tests.data.summary import synth

PAST = time.time() - 60


def _settle(run: Path) -> None:
    """Every job file and folder as if written a minute ago: old enough for its facts to be kept."""
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

    for name in ("result_from", "result_from_doc", "result_fields", "_document"):
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


def test_a_status_keeps_no_numbers_of_a_result_it_did_not_read(runner, run: Path) -> None:
    """A result.json whose damage verdict was already kept is not parsed by the status (nothing to keep);
    the summary reads it then."""
    _status(runner, run)
    verdicts = json.loads((run / damage.VERDICTS).read_text())["files"]
    assert all("result" in verdicts[f"jobs/job{i}/result.json"][4] for i in range(3))
    for i in range(3):
        del verdicts[f"jobs/job{i}/result.json"][4]["result"]
    doc = json.loads((run / damage.VERDICTS).read_text())
    (run / damage.VERDICTS).write_text(json.dumps({**doc, "files": verdicts}))
    _status(runner, run)  # kept rows, or the verdicts: no result.json parsed, none kept
    verdicts = json.loads((run / damage.VERDICTS).read_text())["files"]
    assert not any("result" in verdicts[f"jobs/job{i}/result.json"][4] for i in range(3))
    assert _summary(runner, run) == {"job0": 0.5, "job1": 0.6, "job2": 0.7}


def test_the_summary_parses_each_result_once(runner, run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The damage check and the result's fields read the one document parsed of each result.json."""
    from jobgen.results import collect

    def refuse(*_a, **_k):
        raise AssertionError("a result.json was parsed a second time")

    monkeypatch.setattr(collect, "result_from", refuse)
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
    """The folder's stamp says whether a record absent before may exist now."""
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
    """A record rewritten in place leaves its folder's stamp as it was: the folder's kept listing still
    holds, and the record's own stamp is what tells the damage check to look at it again."""
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


BROKEN = {
    "garbage": b"\xff\x00{",
    "deeply nested": b"[" * 100_000,
    "another version": None,
    "facts of the wrong shape": None,
}


@pytest.mark.parametrize("broken", BROKEN)
def test_a_broken_cache_costs_time_not_answers(runner, run: Path, broken: str) -> None:
    good = _summary(runner, run)
    cache = run / damage.VERDICTS
    if broken == "another version":
        doc = json.loads(cache.read_text())
        from jobgen.results.collect import _RESULT_FIELDS

        for entry in doc["files"].values():
            if "result" in entry[4]:  # what another version read: not taken for this one's
                entry[4]["result"][_RESULT_FIELDS.index("test_acc")] = 0.01
        cache.write_text(json.dumps({**doc, "jobgen": "0.0.1"}))
    elif broken == "facts of the wrong shape":
        doc = json.loads(cache.read_text())
        for rel, entry in doc["files"].items():
            entry[4] = {"result": [1, 2], "problem": 3, "present": "x", "retries": [1]} if "job0" in rel else entry[4]
        cache.write_text(json.dumps(doc))
    else:
        cache.write_bytes(BROKEN[broken])
    assert _summary(runner, run) == good
    rows, warnings = _status(runner, run)
    assert warnings == [] and all("COMPLETED" in row for row in rows), rows


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
    kept = loaded.verdicts._known["jobs/job0/result.json"]  # type: ignore[union-attr]
    assert tuple(kept[:4]) == damage.stamp(os.stat(path)) != before


def _save_often(run_dir: str, rounds: int) -> None:
    for n in range(rounds):
        verdicts = damage.Verdicts(run_dir)
        verdicts.keep(f"jobs/x{n % 7}/result.json", (n, 1, 0, 0), "problem", "x" * 5000)
        verdicts._changed = True
        verdicts.save()


def test_writers_replace_the_cache_whole(run: Path, runner) -> None:
    """Processes saving the cache at once while another reads it: every read finds a whole cache."""
    _summary(runner, run)
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_save_often, args=(str(run), 60)) for _ in range(3)]
    for writer in writers:
        writer.start()
    seen = 0
    while any(w.is_alive() for w in writers):
        assert damage.Verdicts(run)._known, "a reader found half a cache (or none)"
        seen += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert seen and not list(run.glob(f"{damage.VERDICTS}.*.tmp"))


def test_a_folder_not_known_is_listed_not_asked_for_each_record(runner, run: Path, monkeypatch) -> None:
    """The first status of a run lists each job folder once and opens only the records it holds
    (spec.json and result.json here), each stamped by its read: no record is stat'ed, and the ones it
    lacks cost nothing. The next status stats those records and reads none of them (their verdicts
    are kept)."""
    from jobgen.record import model

    stats: list[str] = []
    opens: list[str] = []
    real_stat, real_open = os.stat, os.open
    monkeypatch.setattr(
        model.os, "stat", lambda path, *a, **k: stats.append(os.fspath(path)) or real_stat(path, *a, **k)
    )
    monkeypatch.setattr(
        model.os, "open", lambda path, *a, **k: opens.append(os.fspath(path)) or real_open(path, *a, **k)
    )

    def records(paths: list[str]) -> list[str]:
        return sorted(Path(p).name for p in paths if "/jobs/job" in p and Path(p).name in damage.JOB_FILES)

    rows, warnings = _status(runner, run)
    assert len(rows) == 3 and not warnings
    assert records(stats) == [], stats
    assert records(opens) == ["result.json"] * 3 + ["spec.json"] * 3, opens
    del stats[:], opens[:]
    rows_again, warnings = _status(runner, run)
    assert rows_again == rows and not warnings
    assert records(stats) == ["result.json"] * 3 + ["spec.json"] * 3, stats
    assert records(opens) == [], opens


def test_the_cli_gives_an_in_process_caller_its_garbage_collector_back(runner, run: Path) -> None:
    import gc

    assert gc.isenabled()
    _status(runner, run)
    assert gc.isenabled()
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "status", "no-such-run"])
    assert result.exit_code != 0 and gc.isenabled()


def test_the_job_folders_other_files_are_kept_with_its_listing(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One listing of a job's folder names its records and its other files (its logs): a later command
    takes both from the run's verdicts while the folder is unchanged, and lists it again once a file
    was made in it (a new log of a requeued job)."""
    from jobgen.results import logs

    folder = run / "jobs" / "job1"
    (folder / "slurm-4001.out").write_text("step 1\n")
    (folder / "notes.txt").write_text("mine\n")
    (folder / "checkpoints").mkdir()
    _settle(run)

    def read() -> tuple[tuple[str, ...] | None, list[str]]:
        loaded = Run.load(run)
        job = next(j for j in loaded.jobs if j.name == "job1")
        job.problems()
        found = [path.name for path in logs.of(job, loaded.backend)]
        loaded.keep_facts()
        return job.file_names(), found

    assert read() == (("checkpoints", "notes.txt", "slurm-4001.out"), ["slurm-4001.out"])
    listed: list[str] = []

    def counting(real):
        def count(path="."):
            listed.append(str(path))
            return real(path)

        return count

    monkeypatch.setattr(os, "scandir", counting(os.scandir))
    monkeypatch.setattr(os, "listdir", counting(os.listdir))
    assert read() == (("checkpoints", "notes.txt", "slurm-4001.out"), ["slurm-4001.out"])
    assert listed == []  # from the verdicts: no listing of the folder
    (folder / "slurm-4002.out").write_text("again\n")
    names, found = read()
    assert names == ("checkpoints", "notes.txt", "slurm-4001.out", "slurm-4002.out") and len(found) == 2
    assert listed == [str(folder)]  # one listing of the changed folder, for its records and its logs


def test_a_result_written_after_the_look_is_checked_once_looked_at_again(run: Path) -> None:
    """A job that wrote its result (here cut short) while Slurm was asked: looked at again, its record
    is checked anew, not taken for the absent one the first look saw."""
    path = run / "jobs" / "job0" / "result.json"
    kept = path.read_bytes()
    path.unlink()
    _settle(run)
    job = Run.load(run).jobs[0]
    assert job.problems() == [] and not job.finished
    path.write_bytes(kept[:20])
    job.look_again("result.json")
    assert job.finished
    assert (job._problem("result.json") or "").startswith("truncated or not JSON")
