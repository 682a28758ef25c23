"""`slurm.time = "auto"` and `slurm.mem = "auto"`: the limits each job asks for, from the newest probe
of the same points (`jobgen probe`, jobgen.commands.probe), times the margins.

A probe answers for a point when it ran the same job: the same name, the same `train`, `data` and
`env` values, the same resources (all but the time and memory asked) and backend; and it answers only
for the training code it ran (its code fingerprint), so a probe older than an edit of `training/` is
refused rather than reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.errors import ConfigError
from jobgen.experiment.config import AUTO, Experiment, as_dict
from jobgen.plan.plan import Job
from jobgen.record.lookup import probe_runs, runs_of
from jobgen.results.predict import duration, mem_limit_mb, slurm_time, time_limit_minutes

PREDICTIONS = "predictions.json"  # written into a probe run by `jobgen probe` once its jobs have ended
PREDICTIONS_SCHEMA = 1
# The [slurm] keys that do not change what a job does per second: a probe answers whatever they are.
_NOT_THE_POINT = {"time", "mem", "time_margin", "mem_margin", "chain", "retries", "requeue", "signal", "signal_seconds"}


def code_fingerprint(folder: Path) -> str:
    """sha256 over the training package's source files (relative path and bytes, in sorted order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def point_key(job: Job) -> str:
    """What makes two jobs the same point for a probe (see the module's docstring)."""
    exp = job.exp
    doc = {
        "name": job.name,
        "train": as_dict(exp.train),
        "data": as_dict(exp.data),
        "env": as_dict(exp.env),
        "slurm": {k: v for k, v in as_dict(exp.slurm).items() if k not in _NOT_THE_POINT},
        "backend": exp.launch.backend,
        "launcher": exp.launch.launcher,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def wants_auto(jobs: list[Job]) -> tuple[bool, bool]:
    return any(j.exp.slurm.time == AUTO for j in jobs), any(j.exp.slurm.mem == AUTO for j in jobs)


def for_probe(jobs: list[Job]) -> list[Job]:
    """The jobs as their probe runs them: "auto" limits left to the partition's defaults, one segment."""

    def probed(job: Job) -> Job:
        s = job.exp.slurm
        slurm = dataclasses.replace(
            s, time="" if s.time == AUTO else s.time, mem="" if s.mem == AUTO else s.mem, chain=1
        )
        return dataclasses.replace(job, exp=dataclasses.replace(job.exp, slurm=slurm))

    return [probed(job) for job in jobs]


def read_predictions(run_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((run_dir / PREDICTIONS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == PREDICTIONS_SCHEMA else None


def auto_limits(exp: Experiment, jobs: list[Job], root: Path, code: Path) -> tuple[list[Job], list[str]]:
    """The jobs with "auto" replaced by the chosen limits, and one line per job saying where they came
    from. ConfigError (one line, naming the key) when no probe answers, it is stale, or a job cannot fit."""
    want_time, want_mem = wants_auto(jobs)
    if not (want_time or want_mem):
        return jobs, []
    key = "slurm.time" if want_time else "slurm.mem"
    where = f'{exp.label}: {key} = "auto"'
    if want_time and exp.slurm.chain > 1:
        raise ConfigError(f"{where} chooses one limit for a whole job; with slurm.chain give slurm.time yourself")
    first = f"run `jobgen probe {exp.label}` first"
    probes = [(run, doc) for run in reversed(probe_runs(runs_of(root / exp.name))) if (doc := read_predictions(run))]
    if not probes:
        raise ConfigError(f"{where}: no finished probe of {exp.name} under {root}; {first}")
    wanted = {job.name: point_key(job) for job in jobs}
    chosen = next(((run, doc) for run, doc in probes if _covers(doc, wanted)), None)
    if chosen is None:
        raise ConfigError(
            f"{where}: no probe of these {len(jobs)} point(s) under {root} (the newest, {probes[0][0].name}, "
            f"probed other points or some of them failed); {first}"
        )
    run, doc = chosen
    now = code_fingerprint(code)
    if doc.get("code_fingerprint") != now:
        raise ConfigError(
            f"{where}: the probe {run.name} ran other training code than {code} holds now (code fingerprint "
            f"{str(doc.get('code_fingerprint'))[:12]}, now {now[:12]}): its times no longer hold; "
            f"run `jobgen probe {exp.label}` again"
        )
    points = {p["name"]: p for p in doc["points"]}
    max_s = backends.get(exp.launch.backend).max_time(exp.slurm.partition) if want_time else None
    chosen_jobs, notes = [], []
    for job in jobs:
        new, note = _limits(job, points[job.name], max_s, exp.label, run.name)
        chosen_jobs.append(new)
        notes.append(note)
    if exp.launch.array:  # one script for the array: every task gets the largest limit
        chosen_jobs = _largest(chosen_jobs)
    return chosen_jobs, notes


def _covers(doc: dict[str, Any], wanted: dict[str, str]) -> bool:
    points = {p.get("name"): p for p in doc.get("points") or [] if p.get("predicted_wall_s") is not None}
    return all(name in points and points[name].get("point") == key for name, key in wanted.items())


def _limits(job: Job, point: dict[str, Any], max_s: int | None, label: str, probe: str) -> tuple[Job, str]:
    s = job.exp.slurm
    time, mem, said = s.time, s.mem, []
    if s.time == AUTO:
        wall = float(point["predicted_wall_s"])
        try:
            minutes = time_limit_minutes(wall, s.time_margin, max_s)
        except ValueError as exc:
            raise ConfigError(
                f'{label}: slurm.time = "auto": {job.name}: {exc}; it cannot fit in one job: set slurm.time to '
                "the partition's limit and slurm.chain to the segments it needs"
            ) from None
        time = slurm_time(minutes)
        cap = f", MaxTime {slurm_time(max_s // 60)}" if max_s is not None else ""
        said.append(
            f"time {time} = predicted {duration(wall)} x slurm.time_margin {s.time_margin:g}, in whole minutes{cap}"
        )
    if s.mem == AUTO:
        peak = point.get("predicted_peak_mem_mb")
        if peak is None:
            raise ConfigError(f'{label}: slurm.mem = "auto": the probe {probe} measured no memory for {job.name}')
        mem = f"{mem_limit_mb(float(peak), s.mem_margin)}M"
        said.append(f"mem {mem} = predicted {peak:.0f} MB x slurm.mem_margin {s.mem_margin:g}")
    slurm = dataclasses.replace(s, time=time, mem=mem)
    note = f"{job.name}: {'; '.join(said)} (probe {probe})"
    return dataclasses.replace(job, exp=dataclasses.replace(job.exp, slurm=slurm)), note


def _largest(jobs: list[Job]) -> list[Job]:
    from jobgen.facts import time_seconds

    longest = max((j.exp.slurm.time for j in jobs), key=lambda t: time_seconds(t) or 0)
    most = max((j.exp.slurm.mem for j in jobs), key=lambda m: int(m[:-1]) if m.endswith("M") else 0)
    return [
        dataclasses.replace(
            j, exp=dataclasses.replace(j.exp, slurm=dataclasses.replace(j.exp.slurm, time=longest, mem=most))
        )
        for j in jobs
    ]
