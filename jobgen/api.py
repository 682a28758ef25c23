"""jobgen from Python: load and check an experiment, plan it, submit it, find a run, wait for its jobs
and read their results, from a notebook or a script.

The functions here run the CLI's own code (jobgen.commands, jobgen.results): the same checks, the
same run folders, the one state rule, the summary's rows. They never print and never exit: every
problem raises a jobgen.errors exception (JobgenError and its kinds; BadArgument, also a TypeError,
for a value of the wrong type; WaitTimeout, also a TimeoutError; DriftError from a rerun).
Importing this module imports no part of the training stack (torch and the rest load on the nodes).

    import jobgen.api as jobgen

    exp = jobgen.load("experiments/local_demo.toml", sets=["train.epochs=1"])
    run = jobgen.submit(exp)
    run.wait()
    rows = run.results()        # the columns of `jobgen summary --format csv`
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen.errors import BadArgument, JobgenError
from jobgen.states import State

if TYPE_CHECKING:
    import pandas

    from jobgen.experiment.config import Experiment as Config
    from jobgen.plan.plan import Job
    from jobgen.record.model import Run as Record

__all__ = ["Experiment", "JobStatus", "Run", "State", "get_run", "load", "plan", "rerun", "submit"]

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Experiment:
    """An experiment file, loaded and checked with its overrides (what `jobgen validate` checks)."""

    path: Path
    sets: tuple[str, ...]
    site: str | None
    backend: str | None
    config: Config = field(repr=False)  # the validated tree: config.train.epochs, config.slurm.time, ...
    jobs: tuple[Job, ...] = field(repr=False)  # one per sweep point, in order

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True)
class JobStatus:
    """One job of a run as the one state rule sees it now."""

    name: str
    state: State
    job_id: str | None
    sweep: dict[str, Any]


def load(
    path: PathLike, sets: Sequence[str] = (), *, site: str | None = None, backend: str | None = None
) -> Experiment:
    """Load an experiment file with `--set`-style items ("train.epochs=1"), a site and a backend, and check
    it whole: every key, every sweep point, every job's shape and script."""
    from jobgen.commands.submit import load_experiment
    from jobgen.commands.validate import checked

    where = "jobgen.api.load"
    file = _path(where, "path", path)
    items = _strings(where, "sets", sets)
    _optional_str(where, "site", site)
    _optional_str(where, "backend", backend)
    config = load_experiment(file, backend, items, site=site)
    return Experiment(file, tuple(items), site, backend, config, tuple(checked(config)))


def plan(experiment: Experiment) -> list[Job]:
    """The experiment's jobs, one per sweep point: name, sweep values, resolved experiment (job.exp)."""
    _check_type("jobgen.api.plan", "experiment", experiment, Experiment, "an Experiment from jobgen.api.load()")
    return list(experiment.jobs)


def submit(experiment: Experiment, *, dry_run: bool = False, output_root: PathLike | None = None) -> Run:
    """Write the experiment's run and submit its jobs (the local backend runs them here, to their end);
    returns at once for Slurm. `output_root`: else $JOBGEN_OUTPUT_ROOT, else the experiment's."""
    from jobgen.backends.local import quiet
    from jobgen.commands import submit as sub
    from jobgen.commands import waves

    where = "jobgen.api.submit"
    _check_type(where, "experiment", experiment, Experiment, "an Experiment from jobgen.api.load()")
    _check_type(where, "dry_run", dry_run, bool, "True or False")
    root = _root(where, output_root)
    prepared = sub.prepare(
        experiment.path,
        root,
        backend=experiment.backend,
        dry_run=dry_run,
        sets=list(experiment.sets),
        site=experiment.site,
    )
    if not dry_run:
        with quiet():
            waves.submit_run(prepared.run_dir)
    return Run(prepared.run_dir)


def get_run(ref: PathLike | None = None, *, output_root: PathLike | None = None) -> Run:
    """A run by its folder, its run id, or its experiment (a name or .toml file: its latest submitted run);
    None: the latest submitted run under the output root ($JOBGEN_OUTPUT_ROOT, else ./runs)."""
    from jobgen.record.lookup import find_runs

    where = "jobgen.api.get_run"
    if ref is not None:
        _path(where, "ref", ref)
    root = _root(where, output_root) or Path("runs")
    (run_dir,) = find_runs([os.fspath(ref)] if ref is not None else [], root)
    return Run(run_dir)


def rerun(
    run: Run, jobs: Sequence[str] = (), sets: Sequence[str] = (), *, allow_drift: bool = False, dry_run: bool = False
) -> Run:
    """A new run of the named jobs of `run` (all when none is named) made from its record, as `jobgen
    rerun`: the recorded specs and scripts, the run's code snapshot, `sets` changed on purpose. Raises
    DriftError when the record cannot be repeated as it was, unless `allow_drift`."""
    from jobgen.backends.local import quiet
    from jobgen.commands.rerun import rerun as rerun_jobs
    from jobgen.commands.waves import submit_run

    where = "jobgen.api.rerun"
    _check_type(where, "run", run, Run, "a Run from jobgen.api.get_run() or submit()")
    names, items = _strings(where, "jobs", jobs), _strings(where, "sets", sets)
    _check_type(where, "allow_drift", allow_drift, bool, "True or False")
    _check_type(where, "dry_run", dry_run, bool, "True or False")
    done = rerun_jobs(run.path, names, items, allow_drift=allow_drift, dry_run=dry_run)
    if not dry_run:
        with quiet():
            submit_run(done.run_dir)
    return Run(done.run_dir)


class Run:
    """A run folder: its jobs and their states, waiting for them, their results."""

    def __init__(self, path: PathLike) -> None:
        from jobgen.record.model import Run as Record

        self.path = _path("jobgen.api.Run", "path", path).resolve()
        self._record: Record = Record.load(self.path)  # a damaged manifest is a JobgenError naming it

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def run_id(self) -> str:
        return self._record.run_id

    @property
    def experiment(self) -> str:
        return self._record.experiment

    @property
    def backend(self) -> str:
        return self._record.backend

    @property
    def dry_run(self) -> bool:
        return self._record.dry_run

    @property
    def rerun_of(self) -> str | None:
        """The run id this run repeats (`jobgen rerun`), else None."""
        rerun = self._record.manifest.get("rerun")
        return str(rerun["of"]) if isinstance(rerun, dict) and rerun.get("of") else None

    def jobs(self, *, refresh: bool = False) -> list[JobStatus]:
        """Each job and its state now (the scheduler asked once for all; `refresh`: also about ended ones)."""
        from jobgen.results.state_rule import read_runs

        _check_type("jobgen.api.Run.jobs", "refresh", refresh, bool, "True or False")
        (loaded,) = read_runs([self.path], refresh=refresh)
        return _statuses(loaded)

    def states(self, *, refresh: bool = False) -> dict[str, State]:
        """job name -> its state now."""
        return {job.name: job.state for job in self.jobs(refresh=refresh)}

    def wait(self, *, timeout: float | None = None, interval: float = 10.0) -> dict[str, State]:
        """Block until every job has ended (as `jobgen status --watch`); job name -> final state.
        WaitTimeout when `timeout` seconds pass first."""
        from jobgen.commands.wait import watch

        where = "jobgen.api.Run.wait"
        if timeout is not None:
            _number(where, "timeout", timeout, 0.0)
        _number(where, "interval", interval, 0.0, open_low=True)
        statuses: list[JobStatus] = []
        for loaded in watch(self.path, interval=float(interval), timeout=timeout):
            statuses = _statuses(loaded)
        return {job.name: job.state for job in statuses}

    def results(self, *, combine: bool = True, baseline: str | None = None) -> list[dict[str, Any]]:
        """One row per configuration (`combine`: runs and seeds of one configuration as mean ± std; as
        `jobgen summary`), with the columns of `jobgen summary --format csv`: raw seconds, fractions, MB."""
        from jobgen.results.state_rule import read_some
        from jobgen.results.summary import records

        where = "jobgen.api.Run.results"
        _check_type(where, "combine", combine, bool, "True or False")
        _optional_str(where, "baseline", baseline)
        return records(read_some([self.path]), baseline=baseline, combine=combine)

    def to_pandas(self, *, combine: bool = True, baseline: str | None = None) -> pandas.DataFrame:
        """results() as a pandas DataFrame, its columns in the CSV's order (needs pandas installed)."""
        from jobgen.results.summary import FIELDS

        rows = self.results(combine=combine, baseline=baseline)
        try:
            import pandas
        except ImportError:
            raise JobgenError(
                "Run.to_pandas() needs pandas (pip install pandas); Run.results() gives the rows"
            ) from None
        return pandas.DataFrame(rows, columns=FIELDS)

    def rerun(
        self, jobs: Sequence[str] = (), sets: Sequence[str] = (), *, allow_drift: bool = False, dry_run: bool = False
    ) -> Run:
        """jobgen.api.rerun(self, ...)."""
        return rerun(self, jobs, sets, allow_drift=allow_drift, dry_run=dry_run)


def _statuses(loaded: Record) -> list[JobStatus]:
    return [JobStatus(job.name, job.state, job.job_id, job.sweep) for job in loaded.jobs]


# --- arguments: a wrong type is a BadArgument naming the function and the parameter ----------------------


def _check_type(where: str, name: str, value: Any, kind: type, what: str) -> None:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadArgument(f"{where}: {name} must be {what}, not {_shown(value)}")


def _path(where: str, name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise BadArgument(f"{where}: {name} must be a path (str or os.PathLike), not {_shown(value)}")
    return Path(value)


def _strings(where: str, name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        raise BadArgument(f"{where}: {name} must be a list of strings, not one string (write [{value!r}])")
    if not isinstance(value, Sequence) or not all(isinstance(item, str) for item in value):
        raise BadArgument(f"{where}: {name} must be a list of strings, not {_shown(value)}")
    return list(value)


def _optional_str(where: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise BadArgument(f"{where}: {name} must be a string or None, not {_shown(value)}")


def _number(where: str, name: str, value: Any, low: float, open_low: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadArgument(f"{where}: {name} must be a number of seconds, not {_shown(value)}")
    if value < low or (open_low and value == low):
        raise BadArgument(f"{where}: {name} must be {'above' if open_low else 'at least'} {low:g}, not {value!r}")


def _root(where: str, value: Any) -> Path | None:
    if value is None:
        env = os.environ.get("JOBGEN_OUTPUT_ROOT")
        return Path(env) if env else None
    return _path(where, "output_root", value)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
