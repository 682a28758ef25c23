"""What `jobgen summary` keeps of a run whose jobs have all ended (jobgen.results.kept,
`.rows-summary.json`): its text and warnings, shown again without reading the run while the run's
record and files, the logs of the jobs without a result, the accounting's answer and the way it is
asked for are the same. Each of them changed makes the next summary read the run again."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.record.model import Run
from jobgen.results import kept
from tests.core.conftest import stub_tool
from tests.data.summary import synth

PAST = time.time() - 60
KEPT = ".rows-summary.json"


def _settle(*paths: Path) -> None:
    for path in paths:
        os.utime(path, (PAST, PAST))
        if path.is_file():
            os.utime(path.parent, (PAST, PAST))


@pytest.fixture
def run(tmp_path: Path, bin_dir: Path) -> Path:
    stub_tool(bin_dir, "sacct", "exit 1\n")  # no accounting: the cost columns come from the request
    jobs = [
        synth.FakeJob(f"job{i}", sweep={"train.lr": i // 2, "train.seed": i}, state="COMPLETED", test_acc=0.5 + i / 10)
        for i in range(3)
    ]
    jobs.append(synth.FakeJob("oom", sweep={"train.lr": 9}, state="FAILED", result=None, logs={"slurm-9.out": "x\n"}))
    folder = synth.write_run(tmp_path / "runs", "exp", jobs)
    _settle(*sorted((folder / "jobs").rglob("*"), reverse=True))
    return folder


def _summary(runner, run: Path, *more: str) -> tuple[str, str]:
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "summary", str(run), *more])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def _not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("the run was read although nothing changed")

    monkeypatch.setattr(Run, "load", refuse)


def _kept(run: Path, *more: str) -> bool:
    try:
        with pytest.MonkeyPatch.context() as m:
            _not_read(m)
            kept.summary_text([run], fmt=more[0] if more else "table")
    except AssertionError:
        return False
    return True


def test_an_unchanged_run_is_summarized_from_the_kept_text(runner, run: Path, monkeypatch) -> None:
    first = _summary(runner, run, "--format", "csv")
    assert (run / KEPT).exists() and "oom" in first[0]
    with monkeypatch.context() as m:
        _not_read(m)
        assert _summary(runner, run, "--format", "csv") == first


def test_asked_another_way_it_is_read_again(runner, run: Path) -> None:
    csv = _summary(runner, run, "--format", "csv")
    for other in (["--format", "json"], ["--format", "csv", "--no-combine"], ["--format", "csv", "--baseline", "job2"]):
        assert _summary(runner, run, *other) != csv
    assert _summary(runner, run, "--format", "csv") == csv


def test_a_changed_result_is_read_again(runner, run: Path) -> None:
    _summary(runner, run, "--format", "json", "--no-combine")
    path = run / "jobs" / "job1" / "result.json"
    doc = json.loads(path.read_text())
    text = json.dumps({**doc, "test_acc": 0.9})
    assert len(text) == len(json.dumps(doc))
    with open(path, "r+", encoding="utf-8") as fh:  # in place, the same size, the old mtime: the ctime moved
        fh.write(text)
    os.utime(path, (PAST, PAST))
    rows = json.loads(_summary(runner, run, "--format", "json", "--no-combine")[0])["rows"]
    assert [r["test_acc"] for r in rows if r["config"] == "job1"] == [0.9]


def test_the_log_of_a_job_without_result_is_read_again(runner, run: Path) -> None:
    """Its log says why it stopped: a line appended to it changes the summary."""
    before = _summary(runner, run, "--format", "csv")[0]
    assert "CUDA out of memory" not in before
    log = run / "jobs" / "oom" / "slurm-9.out"
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    os.utime(log, (PAST, PAST))  # its mtime put back; the folder's stamp does not change with an append
    after = _summary(runner, run, "--format", "csv")[0]
    assert "out of memory" in after.lower() and after != before


def test_a_changed_answer_of_the_accounting_is_a_changed_summary(runner, run: Path, bin_dir: Path) -> None:
    before = _summary(runner, run, "--format", "json")[0]
    assert _kept(run, "json")
    line = "{id}|2026-01-01T00:00:00|3600|120|billing=8,cpu=8,gres/gpu=4,node=1||RUNNING"
    stub_tool(bin_dir, "sacct", "".join(f"echo '{line.format(id=4000 + i)}'\n" for i in range(4)))
    after = json.loads(_summary(runner, run, "--format", "json")[0])
    assert after["totals"]["gpu_hours"] == 16.0 and after != json.loads(before)


def test_a_job_that_may_still_change_keeps_nothing(runner, run: Path, bin_dir: Path) -> None:
    for tool in ("squeue", "scontrol"):
        stub_tool(bin_dir, tool, "exit 0\n")
    doc = json.loads((run / "manifest.json").read_text())
    doc["jobs"][0]["state"] = "RUNNING"
    (run / "manifest.json").write_text(json.dumps(doc))
    (run / "jobs" / "job0" / "result.json").unlink()
    _settle(run / "jobs" / "job0")
    _summary(runner, run, "--format", "csv")
    _summary(runner, run, "--format", "csv")
    assert not (run / KEPT).exists()


def test_another_time_zone_reads_the_run_again(runner, run: Path, monkeypatch) -> None:
    """Slurm's times carry no zone: they are read in the local one."""
    _summary(runner, run, "--format", "csv")
    assert _kept(run, "csv")
    monkeypatch.setattr(time, "timezone", time.timezone + 3600)
    assert not _kept(run, "csv")


def test_a_run_moved_elsewhere_is_read_again(runner, run: Path, tmp_path: Path) -> None:
    _summary(runner, run, "--format", "csv")
    moved = tmp_path / "moved" / "exp" / run.name
    moved.parent.mkdir(parents=True)
    os.rename(run, moved)  # the same inodes: only the path tells
    assert not _kept(moved, "csv")


def test_a_broken_cache_costs_time_not_answers(runner, run: Path) -> None:
    good = _summary(runner, run, "--format", "csv")
    doc = json.loads((run / KEPT).read_text())
    doc["whole"]["text"] = 7
    (run / KEPT).write_text(json.dumps(doc))
    assert _summary(runner, run, "--format", "csv") == good
    doc = json.loads((run / KEPT).read_text())
    doc["jobs"][0][3] = "not lines"
    (run / KEPT).write_text(json.dumps(doc))
    assert _summary(runner, run, "--format", "csv") == good


def _report(runner, run: Path, out: Path) -> str:
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), "report", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_text()


@pytest.fixture
def done(tmp_path: Path, bin_dir: Path) -> Path:
    """A run whose every job wrote its result, with its logs."""
    stub_tool(bin_dir, "sacct", "exit 1\n")
    jobs = [synth.FakeJob(f"job{i}", state="COMPLETED", logs={f"slurm-{i}.out": "hi\n"}) for i in range(3)]
    folder = synth.write_run(tmp_path / "done", "exp", jobs)
    _settle(*sorted((folder / "jobs").rglob("*"), reverse=True))
    return folder


def test_an_unchanged_run_gets_the_kept_page_with_the_time_it_is_made(runner, done: Path, tmp_path, monkeypatch):
    first = _report(runner, done, tmp_path / "a.html")
    assert (done / ".rows-report.json").exists() and kept.CREATED not in first
    with monkeypatch.context() as m:
        _not_read(m)
        m.setattr(kept, "made_at", lambda: "2031-01-01 00:00 UTC")
        again = _report(runner, done, tmp_path / "b.html")
    assert "2031-01-01 00:00 UTC" in again
    assert again.replace("2031-01-01 00:00 UTC", "") == re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "", first)


def test_a_log_appended_reads_the_run_again(runner, done: Path, tmp_path) -> None:
    """The page links each job's logs oldest first: a log written to since moves in that order."""
    _report(runner, done, tmp_path / "a.html")
    (done / "jobs" / "job1" / "slurm-1b.out").write_text("later\n")
    os.utime(done / "jobs" / "job1" / "slurm-1b.out", (PAST + 1, PAST + 1))
    os.utime(done / "jobs" / "job1", (PAST, PAST))
    page = _report(runner, done, tmp_path / "b.html")
    assert "slurm-1b.out" in page
    log = done / "jobs" / "job1" / "slurm-1.out"
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("more\n")
    os.utime(log, (PAST + 2, PAST + 2))  # now the newest: linked after slurm-1b.out
    page = _report(runner, done, tmp_path / "c.html")
    assert page.index("slurm-1b.out</a>") < page.index("slurm-1.out</a>")


def test_one_slurm_jobs_out_and_err_are_linked_by_name_without_a_stat(runner, tmp_path, bin_dir, monkeypatch) -> None:
    """A Slurm job has an .out and an .err: one attempt, linked in name order whichever was written last,
    so a 10,000-job report stats none of its 20,000 logs, and a line written to either keeps the page
    (the one a fresh read makes). Logs of several attempts are linked oldest first: each is stat'ed
    once, and that stat is the stamp the page is kept with."""
    stub_tool(bin_dir, "sacct", "exit 1\n")
    jobs = [
        synth.FakeJob(f"job{i}", state="COMPLETED", logs={f"slurm-{i}.out": "hi\n", f"slurm-{i}.err": ""})
        for i in range(3)
    ]
    jobs[2].logs |= {"slurm-7.out": "again\n", "slurm-7.err": ""}  # requeued under another id
    done = synth.write_run(tmp_path / "two", "exp", jobs)
    _settle(*sorted((done / "jobs").rglob("*"), reverse=True))
    job1, job2 = done / "jobs" / "job1", done / "jobs" / "job2"
    os.utime(job1 / "slurm-1.err", (PAST + 1, PAST + 1))  # written after the .out
    for name, moment in (("slurm-2.out", PAST - 9), ("slurm-2.err", PAST - 8), ("slurm-7.err", PAST - 2)):
        os.utime(job2 / name, (moment, moment))
    stats: list[str] = []
    real_stat = os.stat

    def counting(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)).startswith("slurm-"):
            stats.append(os.path.basename(os.fspath(path)))
        return real_stat(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "stat", counting)
        first = _report(runner, done, tmp_path / "a.html")
    assert sorted(stats) == ["slurm-2.err", "slurm-2.out", "slurm-7.err", "slurm-7.out"], stats
    links = re.findall(r">(slurm-[\w.]+)</a>", first)
    assert links[links.index("slurm-1.err") + 1] == "slurm-1.out"
    assert links[links.index("slurm-2.out") : links.index("slurm-2.out") + 4] == [
        "slurm-2.out",
        "slurm-2.err",
        "slurm-7.err",
        "slurm-7.out",
    ]
    _kept_page_after_a_line_is_the_fresh_one(runner, done, job1 / "slurm-1.out", tmp_path, monkeypatch)
    os.utime(job2 / "slurm-2.out", (PAST + 3, PAST + 3))  # the first attempt's log written to last
    page = _report(runner, done, tmp_path / "d.html")
    assert page.index("slurm-7.out</a>") < page.index("slurm-2.out</a>")


def test_a_single_log_written_to_keeps_the_page(runner, done: Path, tmp_path, monkeypatch) -> None:
    """A job with its result shows on the page by its log's name alone: a line appended to its only log
    changes nothing there, so the kept page is shown (no stat of each of 10,000 logs to tell), and it is
    the page a fresh read makes."""
    _report(runner, done, tmp_path / "a.html")
    _kept_page_after_a_line_is_the_fresh_one(
        runner, done, done / "jobs" / "job1" / "slurm-1.out", tmp_path, monkeypatch
    )


def _kept_page_after_a_line_is_the_fresh_one(runner, done: Path, log: Path, tmp_path: Path, monkeypatch) -> None:
    """A line appended to `log`: the next report shows the kept page (the run is not read), and that
    page is the one a fresh read (--refresh) makes."""
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("more\n")
    with monkeypatch.context() as m:
        _not_read(m)
        kept_page = _report(runner, done, tmp_path / "b.html")
    out = tmp_path / "c.html"
    result = runner.invoke(
        main, ["--output-root", str(done.parent.parent), "report", str(done), "-o", str(out), "--refresh"]
    )
    assert result.exit_code == 0, result.output
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"
    assert re.sub(stamp, "", kept_page) == re.sub(stamp, "", out.read_text())


def test_a_run_with_a_job_without_result_keeps_no_page(runner, run: Path, tmp_path) -> None:
    """Such a job's log tail is on the page, with this shell's secrets taken out: not kept."""
    _report(runner, run, tmp_path / "a.html")
    assert not (run / ".rows-report.json").exists()


def test_a_run_with_a_damaged_result_keeps_no_page(runner, done: Path, tmp_path) -> None:
    """A result.json cut short is no usable result: the page shows that job's log tail, not kept."""
    path = done / "jobs" / "job1" / "result.json"
    path.write_bytes(path.read_bytes()[:20])
    _settle(path)
    page = _report(runner, done, tmp_path / "a.html")
    assert "last 1 lines of slurm-1.out" in page
    assert not (done / ".rows-report.json").exists()


def test_a_damaged_record_beside_a_usable_result_keeps_the_page(runner, done: Path, tmp_path) -> None:
    """A metrics.csv cut short costs the curves of that job, not its result: the page is kept."""
    path = done / "jobs" / "job1" / "metrics.csv"
    path.write_text("epoch,step,split,loss\n1,2,train")
    _settle(path)
    _report(runner, done, tmp_path / "a.html")
    assert (done / ".rows-report.json").exists()


def test_the_summary_that_kept_the_jobs_usage_is_kept_and_the_next_asks_sacct_nothing(
    runner, run: Path, bin_dir: Path
) -> None:
    """The first summary of an ended run writes what each job used into the manifest (the accounting's
    final word): the text it showed is kept beside the manifest it wrote, and the next summary neither
    reads the run nor asks the accounting about the jobs whose usage the manifest holds."""
    line = "{id}|2026-01-01T00:00:00|3600|120|billing=8,cpu=8,gres/gpu=4,node=1||COMPLETED"
    stub_tool(
        bin_dir,
        "sacct",
        'echo "$*" >> "$(dirname "$0")/sacct.calls"\n'
        + "".join(f"echo '{line.format(id=4000 + i)}'\n" for i in range(4)),
    )
    first = _summary(runner, run, "--format", "json")[0]
    assert json.loads(first)["totals"]["gpu_hours"] == 16.0
    assert len((bin_dir / "sacct.calls").read_text().splitlines()) == 1
    assert _kept(run, "json")
    assert len((bin_dir / "sacct.calls").read_text().splitlines()) == 1  # the kept text asked nothing
    assert _summary(runner, run, "--format", "json")[0] == first
    assert len((bin_dir / "sacct.calls").read_text().splitlines()) == 1
