"""`jobgen validate`: everything submit checks, without writing anything."""

from __future__ import annotations

from pathlib import Path

from jobgen.commands.submit import load_experiment
from jobgen.experiment.config import Experiment
from jobgen.experiment.sites import SiteDefaults
from jobgen.plan.plan import Job, plan
from jobgen.plan.render import RunInfo, render_job


def validate_file(
    path: str | Path, sets: list[str] | None = None, site: str | None = None
) -> tuple[int, SiteDefaults | None, str | None]:
    """Load, plan and render every job of an experiment in memory: the number of jobs, what the site
    gave, and one line on how many of them fit in the cluster's queue now (queue_fit)."""
    exp = load_experiment(path, sets=sets, site=site)
    count = len(checked(exp))
    return count, exp.site, queue_fit(exp, count)


def checked(exp: Experiment) -> list[Job]:
    """The experiment's jobs, each planned and rendered in memory: every check submit makes before writing."""
    jobs = plan(exp)
    run = RunInfo(run_id="validate", run_dir=Path("/nonexistent/validate"))
    for job in jobs:
        render_job(job, run)
    return jobs


def queue_fit(exp: Experiment, count: int) -> str | None:
    """One line: how many of the experiment's `count` jobs (array tasks and chain segments one each) fit
    in the cluster's queue now; None where its backend has no queue limits to read (or Slurm is not here)."""
    from jobgen import backends

    scheduler = backends.get(exp.launch.backend)
    room = scheduler.queue_room(scheduler.settings(), exp.slurm.qos, exp.slurm.account)
    return room.fit_line(count * max(1, exp.slurm.chain)) if room is not None else None
