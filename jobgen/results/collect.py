"""Read a run directory into one typed row per job: manifest entry, parsed result, cause of failure.

Reads only what the jobs and jobgen wrote (manifest.json, result.json, spec.json, metrics.csv); the logs
are opened only for a job that has no usable result, to name the likely cause. Nothing here raises on a
bad file: a missing, truncated or foreign result becomes a `problem` on that job's row.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from math import isfinite
from pathlib import Path
from typing import Any

from jobgen.backends._base import Attempt
from jobgen.errors import JobgenError
from jobgen.facts import RESULT_SCHEMA, aware_time
from jobgen.record.model import Retries, Run, RunJob
from jobgen.record.store import load_manifest
from jobgen.results import logs
from jobgen.results.cost import (
    USAGE,
    Accounting,
    Usage,
    answer,
    attempts_to_keep,
    keep_asked,
    kept_attempts,
    question,
    usage_of,
)
from jobgen.results.diagnose import LAST_LINE, Cause, find_cause
from jobgen.results.halving import JobRungs, rungs_of
from jobgen.results.state_rule import kept_cause, look_at_records, progress, settle
from jobgen.states import JobInfo, State
from training.progress import PROGRESS_FILE

NO_RESULT = "no result.json"


# Result and JobRow are values nobody changes once made (dataclasses.replace makes another).
@dataclass
class Result:
    """The fields of result.json (schema 1) that the summary shows; None where absent or malformed."""

    engine: str | None = None
    strategy: str | None = None
    precision: str | None = None  # effective precision
    precision_requested: str | None = None
    compile: bool | None = None
    nodes: int | None = None
    devices_per_node: int | None = None
    accelerator: str | None = None  # what the job ran on: "gpu" or "cpu"
    train_s: float | None = None
    total_s: float | None = None
    samples_per_s: float | None = None
    peak_gpu_mb: float | None = None
    peak_host_mb: float | None = None
    best_val_acc: float | None = None
    test_acc: float | None = None
    test_f1: float | None = None
    requeue_count: int | None = None
    epochs_done: int | None = None
    finished_at: datetime | None = None
    scoring: str | None = None  # a split scored on other than its size: the accuracy is not the split's
    world_size: int | None = None
    parameters: int | None = None  # the whole model's parameter elements
    trainable_parameters: int | None = None  # those the optimizer updated (LoRA: the adapters and the head)
    tokens_per_s: float | None = None  # real (non-padding) tokens, all ranks
    gpus: tuple[str, ...] = ()  # the GPUs rank 0 saw (ran_on.gpus); () on CPU
    primary_metric: str | None = None  # the metric that picked the best epoch (training.contract.METRICS)
    test_metrics: dict[str, Any] | None = None  # {metric: value} of the test split (numbers only)
    val_metrics: dict[str, Any] | None = None  # of the tested epoch's validation
    predictions: str | None = None  # the job folder's predictions.csv, when written (its file name)

    @property
    def test_primary(self) -> float | None:
        return (
            None
            if self.test_metrics is None or self.primary_metric is None
            else self.test_metrics.get(self.primary_metric)
        )

    @property
    def val_primary(self) -> float | None:
        return (
            None
            if self.val_metrics is None or self.primary_metric is None
            else self.val_metrics.get(self.primary_metric)
        )


@dataclass
class JobRow:
    """One job of one run, as the summary sees it."""

    run_dir: Path
    run_id: str
    experiment: str
    name: str
    sweep: dict[str, Any]
    state: State
    job_id: str | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    train: dict[str, Any] = field(default_factory=dict)  # spec.json "train", when the result is absent
    result: Result | None = None
    problem: str | None = None  # why there is no usable result
    cause: Cause | None = None
    partial_val_acc: float | None = None  # best so far from metrics.csv, for unfinished jobs
    job_dir: str = ""  # absolute, or relative to the current directory like run_dir
    backend: str = ""  # the run's launch.backend: its scheduler knows where the logs are
    segments: tuple[str, ...] = ()  # a chained job (slurm.chain): each segment's state, "?" where unknown
    retries: Retries | None = None  # slurm.retries: the batch shell's record, once the job failed once
    usage: Usage | None = None  # what it held and used, all attempts together (jobgen.results.cost)
    rungs: JobRungs | None = None  # a job of a halving run: the rungs it reached, its outcome
    # Set when several runs are summarized together (run_setup): what its run was planned from, seeds aside.
    setup: tuple[tuple[str, str], ...] = ()
    source: RunJob | None = field(default=None, repr=False, compare=False)  # the read job it is made of

    @property
    def queue_wait_s(self) -> float | None:
        if self.submitted_at is None or self.started_at is None:
            return None
        wait = (self.started_at - self.submitted_at).total_seconds()
        # Clock skew between the login node and the compute node can make this slightly negative.
        return max(wait, 0.0)


LiveStates = Mapping[tuple[str, str], State | JobInfo]  # (run id, job name) -> what the scheduler said


def collect(runs: Sequence[Run | Path], live_states: LiveStates | None = None) -> list[JobRow]:
    """Rows for every job of every run, in run order then manifest order. The loaded runs' schedulers are
    asked once (per backend, for all their jobs) what the jobs were allocated and used, but for jobs whose
    final usage the manifest kept (jobgen.results.cost.kept_attempts); what is final now is kept."""
    loaded = [run for run in runs if isinstance(run, Run)]
    results = {id(job): job_result(job) for run in loaded for job in run.jobs}
    known: dict[str, list[Attempt]] = {}
    asked: set[int] = set()
    for run in loaded:
        for job in run.jobs:
            found = None if run.refresh else kept_attempts(job, _restarts(results[id(job)][0]))
            if found is None:
                asked.add(id(job))
            else:
                known |= found
    accounting = answer(question(loaded, skip=lambda job: id(job) not in asked)) | known
    rows: list[JobRow] = []
    for each in runs:
        if isinstance(each, Run):
            rungs = rungs_of(each)
            rows.extend(read_job(each, job, accounting, results[id(job)], rungs) for job in each.jobs)
            _keep_usage(each, [job for job in each.jobs if id(job) in asked], accounting, results)
        else:
            rows.extend(collect_run(each, live_states, accounting))
    if len(runs) > 1:
        manifests = {run.run_dir: run.manifest for run in loaded}
        setups: dict[Path, tuple[tuple[str, str], ...]] = {}
        for row in rows:
            if row.run_dir not in setups:
                setups[row.run_dir] = run_setup(row.run_dir, manifests.get(row.run_dir))
            row.setup = setups[row.run_dir]
    return rows


def run_setup(run_dir: Path, manifest: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """What a run's jobs were planned from (its resolved experiment), as sorted (key, value as JSON) pairs,
    less what does not make two jobs different configurations: the seeds (repeats differ by them), the
    sweep (each job's own values count instead) and the description; a key set to its default is as one
    left out. Empty when the run recorded neither its resolved experiment nor its experiment.toml."""
    from jobgen.experiment import resolved

    try:
        tree, _ = resolved.read(run_dir, manifest if manifest is not None else load_manifest(run_dir))
    except (JobgenError, OSError):
        return ()
    return tuple(
        sorted(
            (key, json.dumps(value, sort_keys=True, default=str))
            for key, value in resolved.set_apart_from_defaults(resolved.flatten(tree)).items()
            if not key.startswith("sweep.") and key != "experiment.description" and not is_seed(key)
        )
    )


def is_seed(key: str) -> bool:
    """Whether a dotted key is a seed: jobs that differ by it alone are repeats of one configuration."""
    return key.rsplit(".", 1)[-1] == "seed"


Rungs = Callable[[RunJob, bool], JobRungs | None]  # a run's jobs as halving sees them (halving.rungs_of)


def _restarts(result: Result | None) -> int:
    return (result.requeue_count or 0) if result else 0


def _keep_usage(
    run: Run, jobs: list[RunJob], accounting: Accounting, results: dict[int, tuple[Result | None, str | None]]
) -> None:
    """Write to the manifest the final usage the accounting gave of these jobs: the next command asks
    nothing for them. Best effort: a run folder that cannot be written is asked again next time."""
    if not accounting:
        return
    updates = {}
    for job in jobs:
        kept = attempts_to_keep(job, accounting, _restarts(results[id(job)][0]))
        if kept is not None and job.entry.get(USAGE) != kept:
            updates[job.name] = {USAGE: kept}
    if not updates:
        return
    with contextlib.suppress(JobgenError):
        run.record(updates)


def collect_run(
    run: Run | Path, live_states: LiveStates | None = None, accounting: Accounting | None = None
) -> list[JobRow]:
    """Rows for one run. A run given as a folder is loaded here, its states decided from its files and
    `live_states` (keyed by (run id, job name)) without asking Slurm, its usage from its request and what
    jobgen recorded; a loaded Run keeps its states, and takes its usage from `accounting` when it has it."""
    if not isinstance(run, Run):
        folder = Path(run)
        try:
            run = Run.load(folder)
        except Exception as exc:  # whatever is wrong with it, the other runs still get summarized
            return [_broken_run_row(folder, exc)]
        for job in run.jobs:
            given = (live_states or {}).get((run.run_id, job.name))
            job.live = JobInfo(given) if isinstance(given, State) else given
        settle([run], live=False, record=False)
    rungs = rungs_of(run)
    return [read_job(run, job, accounting, rungs=rungs) for job in run.jobs]


def _broken_run_row(run_dir: Path, exc: Exception) -> JobRow:
    return JobRow(
        run_dir=run_dir,
        run_id=run_dir.name,
        experiment=run_dir.parent.name,
        name="(manifest)",
        sweep={},
        state=State.UNKNOWN,
        problem=f"manifest.json unreadable ({_one_line(exc)}): is this a jobgen run directory?",
    )


def job_result(job: RunJob) -> tuple[Result | None, str | None]:
    """The job's result as the summary counts it (result_of), or why there is none."""
    result, problem = result_of(job)
    if result is not None and job.previous_job_ids:
        # Slurm's restart count starts again under a new job id: add the times jobgen resubmitted it.
        result = dataclasses.replace(result, requeue_count=(result.requeue_count or 0) + len(job.previous_job_ids))
    return result, problem


def read_job(
    run: Run,
    job: RunJob,
    accounting: Accounting | None = None,
    read: tuple[Result | None, str | None] | None = None,
    rungs: Rungs | None = None,
) -> JobRow:
    """One job of a run (its state already decided) -> a row; `read`: its job_result, when known;
    `rungs`: halving.rungs_of(run), when made."""
    result, problem = read if read is not None else job_result(job)
    row = JobRow(
        run_dir=run.run_dir,
        run_id=run.run_id,
        experiment=run.experiment,
        name=job.name,
        sweep=job.sweep,
        state=job.state,
        job_id=job.job_id,
        submitted_at=aware_time(job.entry.get("submitted_at")),
        started_at=_started_at(job.live, job.entry, result),
        result=result,
        job_dir=job.folder,
        backend=run.backend,
        source=job,
        segments=_segments(job),
        retries=job.retries(),
        rungs=(rungs or rungs_of(run))(job, result is not None),
        usage=usage_of(job, accounting, _restarts(result)),
    )
    if result is not None:
        return dataclasses.replace(row, problem=result.scoring) if result.scoring else row
    return _unfinished(row, job, problem, run.refresh)


def _segments(job: RunJob) -> tuple[str, ...]:
    extra = getattr(job.live, "extra", None) or {}
    if extra.get("segments"):
        return tuple(extra["segments"])
    return tuple("?" for _ in job.segments)


def _unfinished(row: JobRow, job: RunJob, problem: str | None, refresh: bool = False) -> JobRow:
    """Fill in what a job without a usable result was asked to do, got so far, and why it stopped (what
    its logs said when its end was recorded, else its logs now). A job that halving paused or stopped
    at a rung, or that waits to resume past one, ended as planned: no problem, no cause."""
    planned = row.rungs is not None and bool(row.rungs.label())
    cause = None if planned else job.cause
    if cause is None and not planned and not job.cause_read and _may_have_died(row.state, job.live):
        known, cause = kept_cause(job, refresh)
        if not known:
            cause = find_cause(logs.of(job, row.backend), row.run_dir)
    train = job.spec().get("train")
    said = job.live.state if job.live and job.live.state is not State.UNKNOWN else job.recorded
    return dataclasses.replace(
        row,
        train=train if isinstance(train, dict) else {},
        problem=None if planned else _explain_missing(row.state, said, problem, job.entry.get("error"), cause, job),
        cause=cause,
        partial_val_acc=read_best_val_acc(job.job_dir / "metrics.csv") if job.has("metrics.csv") else None,
    )


def _may_have_died(state: State, live: JobInfo | None) -> bool:
    if state in (State.DRY_RUN, State.NOT_SUBMITTED, State.WAITING):
        return False
    # Live info that says queued or running is current; without it, the logs are the freshest evidence.
    return live is None or state.is_final


def _explain_missing(
    state: State, said: State, problem: str | None, error: Any, cause: Cause | None, job: RunJob
) -> str:
    if state is State.NOT_SUBMITTED:
        return f"not submitted: {error}" if error else "not submitted"
    if state is State.WAITING:
        return "waiting for room in the queue (launch.max_queued): submitted when jobs of the sweep end"
    if state is State.DRY_RUN:
        return "dry run: nothing was submitted"
    if problem and problem != NO_RESULT:
        return problem  # a result that exists but cannot be used says more than the logs
    if cause is not None and cause.kind != LAST_LINE:
        return cause.message
    if state in (State.SUBMITTED, State.PENDING) and cause is None:
        return "not started yet: no result"
    if not state.is_final:
        done = progress(job)
        where = f"at {done}" if done != "-" else "no result yet"
        return f"still running: {where}" + (f"; last log line: {cause.message}" if cause else "")
    if said is State.COMPLETED:
        return "ended with exit 0 but without writing result.json: its work is lost; check the job's log"
    if cause is not None:
        return f"last log line: {cause.message}"
    return f"{NO_RESULT} and no log"


def _started_at(live: JobInfo | None, entry: Mapping[str, Any], result: Result | None) -> datetime | None:
    """Slurm's start time (live, or as `jobgen status` last recorded it), else the result's own clock."""
    live_start = getattr(live, "start", None) or getattr(live, "started_at", None)
    start = live_start if isinstance(live_start, datetime) else aware_time(live_start or entry.get("started_at"))
    if start is not None:
        return start if start.tzinfo else start.astimezone()
    if result is None or result.finished_at is None or result.total_s is None:
        return None
    return result.finished_at - timedelta(seconds=result.total_s)


# --- result.json ----------------------------------------------------------------------------------------


def result_of(job: RunJob) -> tuple[Result | None, str | None]:
    """A job's result, from its result.json or from the run's index (RunJob.indexed)."""
    if not job.finished:
        return None, NO_RESULT
    kept = job.indexed("result.json", RESULT_KEY, _read_result, _is_result_fields)
    if isinstance(kept, str):
        return None, kept
    return _result(kept), None


def look_and_keep(runs: Sequence[Run]) -> None:
    """What a status, summary or report does with every job's records once Slurm has answered: read and
    check them (look_at_records), and index what the summary takes from those it parsed (the results'
    numbers, what each spec asked for): the next command parses none again."""
    look_at_records(runs, keep_what_was_read)


def keep_what_was_read(job: RunJob) -> None:
    """Index what a summary takes from the job's records this command parsed (its damage checks did):
    the fields of its result.json, what its spec.json asked for (jobgen.results.cost), and what a status
    shows of its progress.json and retries.json."""
    if job.parsed("result.json"):
        job.indexed("result.json", RESULT_KEY, _read_result, _is_result_fields)
    if job.parsed("spec.json"):
        keep_asked(job)
    if job.parsed(PROGRESS_FILE):
        job.progress()
    if job.parsed("retries.json"):
        job.retries()


RESULT_KEY = "result"  # the key of a result's fields in the run's index
_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(Result))


def _is_result_fields(kept: Any) -> bool:
    """Whether an indexed value has the shape _read_result gives: why the result is unusable, or its fields."""
    return type(kept) is str or (type(kept) is dict and kept.keys() == _RESULT_FIELDS)


def _read_result(job: RunJob) -> dict[str, Any] | str:
    """A result.json's Result fields as JSON values, or why it cannot be used. The document
    the damage check parsed is not parsed again (RunJob.json); a broken one is, for the summary's reason."""
    doc, broken = job.json("result.json")
    if broken is not None or type(doc) is not dict:
        try:
            raw = job.raw("result.json")
        except OSError as exc:
            return f"result.json unreadable ({_one_line(exc)})"
        if raw is None:
            return NO_RESULT
        doc, problem = _document(raw)
        if doc is None:
            return problem or NO_RESULT
    schema = doc.get("schema")
    if schema != RESULT_SCHEMA:
        return _schema_problem(schema, doc)
    return result_fields(doc)


def _document(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """result.json's bytes as a JSON object, or why they are not one."""
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        return None, f"result.json is not UTF-8 ({_one_line(exc)}): rerun the job"
    except json.JSONDecodeError as exc:
        return None, f"result.json is corrupt or truncated ({exc.msg} at line {exc.lineno}): rerun the job"
    if not isinstance(data, dict):
        return None, "result.json is not a JSON object: rerun the job"
    return data, None


def _schema_problem(schema: Any, data: Mapping[str, Any]) -> str:
    writer = _get(data, "versions", "jobgen")
    by = f", written by jobgen {writer}" if writer else ""
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > RESULT_SCHEMA:
        return f"result from a newer format (schema {schema}{by}): upgrade jobgen to read it"
    return (
        f"result from an older format (schema {schema!r}{by}): rerun the job, "
        "or summarize it with the jobgen version that wrote it"
    )


def parse_result(data: Mapping[str, Any]) -> Result:
    """Pick the summary's fields out of a schema-1 result; wrong types become None."""
    return _result(result_fields(data))


def _result(fields: dict[str, Any]) -> Result:
    """A Result from its fields as result_fields gives them (and the run's index keeps them)."""
    return Result(**{**fields, "finished_at": aware_time(fields["finished_at"]), "gpus": tuple(fields["gpus"])})


_EMPTY: dict[str, Any] = {}


def result_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The Result's fields of a schema-1 result, as JSON values (`finished_at` as ISO text, `gpus` as a
    list): what the run's index keeps of a result.json. Wrong types become None."""
    if type(data) is not dict:
        data = dict(data)
    get = data.get
    precision = get("precision")
    nested = _object(precision)
    requested = _str(nested.get("requested"))
    effective = _str(nested.get("effective")) or requested
    if isinstance(precision, str):  # tolerate a flat string
        requested = effective = precision
    compiled = get("compile")
    times = _object(get("times_s"))
    throughput = _object(get("throughput"))
    memory = _object(get("peak_memory_mb"))
    when = aware_time(get("finished_at"))
    return {
        "engine": _str(get("engine")),
        "strategy": _str(get("strategy")),
        "precision": effective,
        "precision_requested": requested,
        "compile": compiled if type(compiled) is bool else None,
        "nodes": _int(get("nodes")),
        "devices_per_node": _int(get("devices_per_node")),
        "accelerator": _str(get("accelerator")),
        "train_s": _num(times.get("train")),
        "total_s": _num(times.get("total")),
        "samples_per_s": _num(throughput.get("samples_per_s")),
        "peak_gpu_mb": _num(memory.get("gpu_max_reserved", memory.get("gpu_max_allocated"))),  # what the job held
        "peak_host_mb": _num(memory.get("host_rss")),
        "best_val_acc": _num(get("best_val_acc")),
        "test_acc": _num(get("test_acc")),
        "test_f1": _num(get("test_f1")),
        "requeue_count": _int(get("requeue_count")),
        "epochs_done": _int(get("epochs_done")),
        "finished_at": when.isoformat() if when else None,
        "scoring": _scoring_problem(data),
        "world_size": _int(get("world_size")),
        "parameters": _int(_object(get("parameters")).get("total")),
        "trainable_parameters": _int(_object(get("parameters")).get("trainable")),
        "tokens_per_s": _num(throughput.get("tokens_per_s")),
        "gpus": [g for g in _list(_object(get("ran_on")).get("gpus")) if isinstance(g, str)],
        "primary_metric": _str(get("primary_metric")),
        "test_metrics": _metrics(get("test_metrics")),
        "val_metrics": _metrics(get("val_metrics")),
        "predictions": _file_name(get("predictions")),
    }


def _metrics(value: Any) -> dict[str, float] | None:
    """A result's {metric: value}: the numbers only (an undefined metric is null there), or None."""
    if type(value) is not dict:
        return None
    return {k: float(v) for k, v in value.items() if type(k) is str and type(v) in (int, float)}


def _file_name(value: Any) -> str | None:
    """A file the job wrote into its own folder: a plain name, never a path elsewhere."""
    return value if isinstance(value, str) and value and "/" not in value and value not in (".", "..") else None


def _object(value: Any) -> Mapping[str, Any]:
    """A nested JSON object, or an empty one in its place (a wrong type reads as absent)."""
    if value is None:  # absent (most optional fields): no ABC check
        return _EMPTY
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return _EMPTY


def _scoring_problem(data: Mapping[str, Any]) -> str | None:
    """Every sample of a split counts once: say so when result.json's scored count differs."""
    samples, counted = _object(data.get("samples")), _object(data.get("scored"))
    if not samples or not counted:
        return None  # nothing to compare (most results: both there, checked below)
    wrong = []
    for split in ("validation", "test"):
        size, scored = _int(samples.get(split)), _int(counted.get(split))
        if size is not None and scored is not None and size != scored:
            wrong.append(f"{split} scored on {scored:,} rows of {size:,}")
    return "; ".join(wrong) + ": its accuracy is not the split's" if wrong else None


# --- spec.json and metrics.csv: what an unfinished job was asked to do and got so far ------------------


VAL_ACC_COLUMNS = ("val_acc", "val_accuracy", "val/acc", "validation_acc")
VAL_SPLITS = ("validation", "val")


def read_best_val_acc(path: Path) -> float | None:
    """Best validation accuracy logged so far, or None (no file, no such column, unreadable).

    Reads both shapes: a wide `val_acc` column, or long rows with `split` = validation and an `acc` column.
    """
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            column = next((c for c in VAL_ACC_COLUMNS if c in fields), None)
            if column is None and {"split", "acc"} <= set(fields):
                values = [_float_or_none(r.get("acc")) for r in reader if r.get("split") in VAL_SPLITS]
            elif column is not None:
                values = [_float_or_none(r.get(column)) for r in reader]
            else:
                return None
    except (OSError, csv.Error, UnicodeDecodeError):
        return None
    found = [v for v in values if v is not None and v == v]
    return max(found) if found else None


@dataclass(frozen=True)
class Point:
    """One row of metrics.csv (docs/contracts.md): None where the column is empty or absent."""

    split: str
    step: float | None
    time_s: float | None
    loss: float | None
    acc: float | None


def read_metrics(path: str | os.PathLike[str]) -> list[Point]:
    """The rows of a job's metrics.csv, or [] when there is none (or it cannot be read)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [
                Point(
                    str(r.get("split") or ""),
                    _float_or_none(r.get("step")),
                    _float_or_none(r.get("time_s")),
                    _float_or_none(r.get("loss")),
                    _float_or_none(r.get("acc")),
                )
                for r in csv.DictReader(f)
            ]
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


# --- small tolerant converters --------------------------------------------------------------------------


# The exact JSON types first (what a record holds), the ABC and union checks only for anything else.


def _get(data: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if type(data) is not dict and not isinstance(data, Mapping):
            return None
        data = data.get(key)  # type: ignore[assignment]
    return data


def _num(value: Any) -> float | None:
    """A finite number as a float; None for anything else. NaN and the infinities (a JSON record can hold
    them) are "unknown", as is an integer beyond a float's range."""
    kind = type(value)
    if kind is float:
        return value if isfinite(value) else None
    if value is None:
        return None
    if kind is not int and (isinstance(value, bool) or not isinstance(value, int | float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if isfinite(number) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if value is None:
        return None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    if type(value) is str:
        return value or None
    if value is None:
        return None
    return value if isinstance(value, str) and value else None


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
