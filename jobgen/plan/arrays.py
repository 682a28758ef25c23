"""A sweep as Slurm job arrays: one array per chunk of at most MaxArraySize jobs.

All jobs of an array share one allocation shape, so arrays are only made from sweeps whose points
ask for identical resources; each task runs its own job's script inside the array's allocation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobgen.backends._slurm import DEFAULT_MAX_ARRAY_SIZE
from jobgen.errors import PlanError
from jobgen.facts import submit_tag
from jobgen.plan.plan import Job
from jobgen.plan.render import RunInfo, environment, sbatch_options, with_tag

__all__ = ["DEFAULT_MAX_ARRAY_SIZE", "render_arrays"]
_PER_JOB_FLAGS = {"job-name", "output", "error"}


def shared_options(jobs: list[Job], run: RunInfo) -> list[tuple[str, str | None]]:
    """The #SBATCH options every job shares; refuses a sweep whose jobs differ in resources."""
    first = None
    for job in jobs:
        opts = [o for o in sbatch_options(job, run.job_dir(job)) if o[0] not in _PER_JOB_FLAGS]
        if first is None:
            first = opts
        elif opts != first:
            differ = sorted({f for f, _ in set(opts) ^ set(first)})
            raise PlanError(
                f"launch.array: job {job.name!r} asks for other resources ({', '.join(differ)}) than the first "
                "job; an array shares one shape: drop launch.array or sweep only non-resource keys"
            )
    return first or []


def render_arrays(
    jobs: list[Job], scripts: list[str], run: RunInfo, experiment_file: Path, parallelism: int, chunk: int
) -> list[dict[str, Any]]:
    """[{name, script (relative), text, tasks}] for each chunk of the sweep."""
    shared = shared_options(jobs, run)
    comment = dict(shared).get("comment")
    shared = [o for o in shared if o[0] != "comment"]
    experiment = jobs[0].exp.name
    out = []
    for k, start in enumerate(range(0, len(jobs), chunk)):
        part = jobs[start : start + chunk]
        name = f"array-{k}"
        spec = f"0-{len(part) - 1}" + (f"%{parallelism}" if parallelism else "")
        log = str(run.run_dir / "arrays").replace("%", "%%")
        opts = [
            ("job-name", f"{experiment}.{name}"),
            *shared,
            ("array", spec),
            ("output", f"{log}/slurm-%A_%a.out"),
            ("error", f"{log}/slurm-%A_%a.err"),
            ("comment", with_tag(submit_tag(run.run_id, name), comment)),
        ]
        text = (
            environment()
            .get_template("array.sbatch.j2")
            .render(
                version=run.version,
                experiment_file=str(experiment_file),
                array_name=name,
                run_id=run.run_id,
                git_sha=run.git_sha,
                git_dirty=run.git_dirty,
                sbatch=opts,
                scripts=[str(run.run_dir / s) for s in scripts[start : start + chunk]],
            )
        )
        out.append({"name": name, "script": f"arrays/{name}.sbatch", "text": text, "tasks": [j.name for j in part]})
    return out
