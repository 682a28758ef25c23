"""`jobgen summary` of a run that did not change: the text shown last time, kept with what it came from.

A summary is a function of the run's record and files, of what the accounting answers, and of how it
is asked for (format, baseline, combining, colour, the screen's width, the time zone that Slurm's
times are read in). Of a run whose every job has ended with its state recorded, the text and the
damage warnings are kept (jobgen.record.rows, `.rows-summary.json`) with the digest of the manifest, the
stamps of each job's folder and records, and of the logs of each job without a usable result (they
say why it stopped), the question put to the accounting and the digest of its answer. The next
summary asked the same way checks those (the accounting is asked the same question again: a
changed answer is a changed summary) and prints the kept text; anything else reads the run.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.errors import JobgenError
from jobgen.record import rows
from jobgen.record.damage import stamp
from jobgen.record.model import Run, RunJob
from jobgen.results import cost, logs
from jobgen.results.collect import look_and_ask
from jobgen.results.report import CREATED, build_report, check_folder, made_at, write_page
from jobgen.results.state_rule import NEVER_RAN, from_record, kept_cause, read_some
from jobgen.results.summary import summarize

SUMMARY, REPORT = "summary", "report"


def summary_text(
    run_dirs: Sequence[Path],
    *,
    refresh: bool = False,
    baseline: str | None = None,
    fmt: str = "table",
    plot: Path | None = None,
    combine: bool = True,
    color: bool = False,
) -> tuple[str, list[str]]:
    """(the summary of these runs as `jobgen summary` prints it, one warning per damaged record)."""
    width = shutil.get_terminal_size((200, 24)).columns
    alone = len(run_dirs) == 1 and not refresh and plot is None
    how = _how(run_dirs[0], fmt, baseline, combine, color, width) if alone else None
    if alone:
        found = rows.load(run_dirs[0], SUMMARY)
        if found is not None and _still(found[0], how) and all(_is_lines(v) for v in found[1]):
            return found[0]["text"], [f"{Path(run_dirs[0])}/{line}" for lines in found[1] for line in lines]
    loaded = read_some(run_dirs, refresh=refresh, meanwhile=look_and_ask)
    text = summarize(loaded, baseline=baseline, fmt=fmt, plot=plot, combine=combine, color=color, width=width)
    warnings = []
    for run in loaded:
        if isinstance(run, Path):
            continue  # its manifest is damaged: the summary's own rows say so
        problems = [job.problems() for job in run.jobs]
        run.keep_facts()
        warnings += [f"{run.run_dir}/{line}" for lines in problems for line in lines] + run.notes
        if alone and not _keep(run, how, text, problems):
            rows.forget(run.run_dir, SUMMARY)
    return text, warnings


def _how(run_dir: Path, fmt: str, baseline: str | None, combine: bool, color: bool, width: int) -> list[Any]:
    """Everything besides the run's files that the text depends on."""
    return [os.path.abspath(run_dir), fmt, baseline, combine, color, width, _zone()]


def _zone() -> list[Any]:
    """The local time zone, which Slurm's times (they carry none) are read in."""
    return [list(time.tzname), time.timezone, time.altzone]


def _still(whole: Any, how: list[Any] | None) -> bool:
    """Whether the kept summary was asked the same way and the accounting still answers the same."""
    try:
        if whole["how"] != how or type(whole["text"]) is not str:
            return False
        asking, said = whole["asked"], whole["said"]
        if type(asking) is not dict or not all(
            type(ids) is list and all(type(i) is str for i in ids) for ids in asking.values()
        ):
            return False
        return bool(cost.digest(cost.answer(asking)) == said)
    except (KeyError, TypeError, JobgenError):
        return False


def _is_lines(value: Any) -> bool:
    return type(value) is list and all(type(line) is str for line in value)


def _keep(run: Run, how: list[Any] | None, text: str, problems: list[list[str]], every_log: bool = False) -> bool:
    """Keep the summary (`every_log`: the report) of a run whose every job's row came from its record
    and files alone. A report is kept only when no job lacks a usable result: the page shows the end of
    such a job's logs, with the secrets of this shell's environment taken out."""
    if run.asked is None or not all(from_record(job) for job in run.jobs):
        return False
    if every_log:
        for job in run.jobs:
            job.look()  # every record stat'ed (the page needs not all): their stamps are kept
        if not all(job.recorded in NEVER_RAN or _usable(job) for job in run.jobs):
            return False
    try:
        in_folder = backends.get(run.backend).logs_in_job_folder()
    except JobgenError:
        in_folder = False
    more = []
    for job in run.jobs:
        found = _log_stamps(run, job, in_folder, every_log)
        if found is None:
            return False
        more.append(found)
    whole = {"how": how, "text": text, "asked": run.asked[0], "said": run.asked[1]}
    return rows.keep(run, REPORT if every_log else SUMMARY, whole, problems, more)


def _usable(job: RunJob) -> bool:
    """The job wrote a result the summary can read (its damage check finds nothing wrong). Most jobs
    have no damaged record at all: their looks (RunJob.problems) say so without asking of result.json."""
    return job.finished and (not job.problems() or job._problem("result.json") is None)


def report_page(run_dirs: Sequence[Path], out: Path, *, refresh: bool = False, baseline: str | None = None) -> Path:
    """Write `jobgen report`'s page of these runs to `out`. The page of a run whose every job has ended
    with a usable result (or never ran) is kept like a summary (`.rows-report.json`), with the stamps of
    every job's logs too (the page links them, oldest first), and written again, with the time it is
    made, while none of it changed."""
    check_folder(out)
    alone = len(run_dirs) == 1 and not refresh
    how = [os.path.abspath(run_dirs[0]), str(run_dirs[0]), baseline, _zone()] if alone else None
    if alone:
        found = rows.load(run_dirs[0], REPORT)
        if found is not None and _still(found[0], how) and CREATED in found[0]["text"]:
            return write_page(out, found[0]["text"].replace(CREATED, made_at()))
    loaded = read_some(run_dirs, refresh=refresh, meanwhile=look_and_ask)
    html = build_report(loaded, baseline, created=CREATED)
    for run in loaded:
        if isinstance(run, Run):
            run.keep_facts()
            if alone and not _keep(run, how, html, [[] for _ in run.jobs], every_log=True):
                rows.forget(run.run_dir, REPORT)
    return write_page(out, html.replace(CREATED, made_at()))


def _log_stamps(run: Run, job: RunJob, in_folder: bool, every_log: bool = False) -> list[list[Any]] | None:
    """The stamps of the logs a job's row may have been read from (a job without a usable result: they
    say why it stopped; `every_log`: every job's); None when they cannot be told by the job folder's
    stamp (`in_folder`: the run's scheduler writes every log in the job's folder itself)."""
    if job.recorded in NEVER_RAN or (not every_log and (_usable(job) or kept_cause(job)[0])):
        return []  # the row was read from the record and its files alone
    if not in_folder:
        return None
    found = logs.named(job, run.backend)
    if every_log and (len(found) < 2 or job.log_marks == {}) and _usable(job):
        # The page shows a job with its result by its logs' names alone (no tail), found in the folder
        # whose stamp is kept, in an order their names gave (a single log, or one Slurm job's .out and
        # .err: jobgen.backends._base._in_order): no stat of them (20,000 a report).
        return []
    marks = job.log_marks or {}
    out = []
    for name, path in found:
        # The stat that put the logs in order when there was one (taken before any log was read).
        st = marks[name] if name in marks else _stat(path)
        if st is None:
            return None
        out.append([name, *stamp(st)])
    return out


def _stat(path: Path | str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None
