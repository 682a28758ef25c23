"""`jobgen probe EXPERIMENT`: every sweep point runs as its own job, through the experiment's backend and
script, on a step budget (training/probe.py); once they end, each point's measurements and the
predicted wall time and peak memory of its full job (jobgen.results.predict).

The probe is a run of its own kind ("kind": "probe" in its manifest): `jobgen runs` lists it, and it
is never the latest run that summary, status or report read (jobgen.record.lookup.latest_real). Its
predictions go into the run's predictions.json, where `slurm.time = "auto"` finds them
(jobgen.commands.limits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.commands import limits, submit, waves
from jobgen.commands.wait import watch
from jobgen.errors import JobgenError
from jobgen.facts import now_iso
from jobgen.plan.plan import Job
from jobgen.record import store
from jobgen.record.model import Run, RunJob
from jobgen.results import logs
from jobgen.results.cost import elapsed_seconds
from jobgen.results.diagnose import find_cause
from jobgen.results.predict import Prediction, predict

DEFAULT_STEPS = 20
DEFAULT_WARMUP_STEPS = 5
DEFAULT_EVAL_SAMPLES = 256


@dataclass(frozen=True)
class Point:
    """One sweep point of a probe: its prediction, or why it has none."""

    name: str
    state: str
    prediction: Prediction | None
    cause: str = ""
    hint: str = ""

    def as_json(self, key: str = "") -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "point": key, "state": self.state}
        if self.prediction is not None:
            doc.update(self.prediction.as_json())
        else:
            doc.update(predicted_wall_s=None, predicted_peak_mem_mb=None, cause=self.cause, hint=self.hint)
        return doc


@dataclass(frozen=True)
class Probe:
    run_dir: Path
    points: list[Point]


def probe(
    path: str | Path,
    output_root: Path | None = None,
    *,
    backend: str | None = None,
    sets: list[str] | None = None,
    site: str | None = None,
    steps: int = DEFAULT_STEPS,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    eval_samples: int = DEFAULT_EVAL_SAMPLES,
    timeout: float | None = None,
    interval: float = 5.0,
    on_run: Callable[[Path], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> Probe:
    """Write the probe run, submit it (in waves when it does not fit in the queue: `say` gets the line on
    how many of its jobs fit), wait for its jobs, predict; JobgenError when every point failed."""
    budget = {"steps": steps, "warmup_steps": warmup_steps, "eval_samples": eval_samples}
    prepared = submit.prepare(path, output_root, backend=backend, sets=sets, site=site, probe=budget)
    if on_run is not None:
        on_run(prepared.run_dir)
    waves.submit_run(prepared.run_dir, say=say)
    run = _last(watch(prepared.run_dir, interval=interval, timeout=timeout))
    points = [
        point_of(job, plan, run.backend) for job, plan in zip(_in_order(run, prepared.jobs), prepared.jobs, strict=True)
    ]
    doc = {
        "schema": limits.PREDICTIONS_SCHEMA,
        "created": now_iso(),
        "code_fingerprint": limits.code_fingerprint(prepared.run_dir / "code" / "training"),
        "points": [p.as_json(limits.point_key(job)) for p, job in zip(points, prepared.jobs, strict=True)],
    }
    store.atomic_write(prepared.run_dir / limits.PREDICTIONS, store.dumps(doc))
    if not any(p.prediction for p in points):
        first = points[0]
        raise JobgenError(
            f"probe of {len(points)} point(s): every one failed; first: {first.name}: {first.state}: "
            f"{first.cause or 'no cause found'}" + (f" ({first.hint})" if first.hint else "") + f"; run: {run.run_dir}"
        )
    return Probe(prepared.run_dir, points)


def _last(readings: Iterator[Run]) -> Run:
    """The last reading of a watch: the run once every job has ended."""
    last = next(readings)
    for last in readings:  # noqa: B007 - only the last one matters
        pass
    return last


def _in_order(run: Run, jobs: list[Job]) -> list[RunJob]:
    by_name = {job.name: job for job in run.jobs}
    return [by_name[job.name] for job in jobs]


def point_of(job: RunJob, planned: Job, backend: str) -> Point:
    """The point's prediction from its probe.json and the probe job's own elapsed time; else why not,
    from its logs (jobgen.results.diagnose, as the summary says it)."""
    measured, problem = job.json("probe.json")
    if isinstance(measured, dict) and not problem:
        try:
            ranks = max(planned.exp.train.devices, 1)
            return Point(job.name, job.state.value, predict(job.name, measured, elapsed_seconds(job), ranks))
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"probe.json lacks {exc}"
    cause = job.cause or find_cause(logs.files(backend, job.job_dir), job.run_dir)
    if cause is not None:
        return Point(job.name, job.state.value, None, cause.message, cause.hint)
    said = problem or "the job wrote no probe.json"
    return Point(job.name, job.state.value, None, said, f"read its log: jobgen logs {job.run_dir} {job.name}")


def table(points: list[Point]) -> tuple[list[str], list[list[str]]]:
    header = [
        "job",
        "samples/s",
        "data prep",
        "eval ms/sample",
        "checkpoint",
        "peak mem (MB)",
        "predicted wall",
        "predicted mem (MB)",
    ]
    rows = []
    for p in points:
        e = p.prediction
        if e is None:
            rows.append([p.name, p.state, "", "", "", "", "", ""])
            continue
        gpu = f" + {e.peak_gpu_mb:.0f} GPU" if e.peak_gpu_mb is not None else ""
        rows.append(
            [
                p.name,
                f"{e.samples_per_s:.1f}" if e.samples_per_s is not None else "",
                f"{e.data_prep_s:.1f}s",
                f"{e.eval_s_per_sample * 1000:.2f}" if e.eval_s_per_sample is not None else "",
                f"{e.checkpoint_s:.1f}s",
                (f"{e.peak_rss_mb:.0f} host" if e.peak_rss_mb is not None else "") + gpu,
                _wall(e),
                f"{e.predicted_peak_mem_mb:.0f}" if e.predicted_peak_mem_mb is not None else "",
            ]
        )
    return header, rows


def _wall(e: Prediction) -> str:
    from jobgen.results.predict import duration

    return (
        f"{duration(e.predicted_wall_s)} (start {e.startup_s:.0f}s + prep {e.data_prep_s:.0f}s + train "
        f"{e.train_s:.0f}s + eval {e.eval_s:.0f}s + ckpt {e.checkpoints_s:.0f}s)"
    )


def failures(points: list[Point]) -> list[str]:
    return [f"{p.name}: {p.state}: {p.cause}" + (f" ({p.hint})" if p.hint else "") for p in points if not p.prediction]
