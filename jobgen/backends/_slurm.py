"""What every scheduler that hands jobs to Slurm shares: states, cancel, requeue, signals, finding jobs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen.backends import _tools as slurm
from jobgen.backends._base import Scheduler
from jobgen.errors import SubmitError

if TYPE_CHECKING:
    from jobgen.experiment.config import Experiment
    from jobgen.results.status import JobInfo


class SlurmScheduler(Scheduler):
    logs = {"out": ("slurm-*.out",), "err": ("slurm-*.err",)}

    def states(self, job_ids: list[str]) -> dict[str, JobInfo]:
        from jobgen.results.status import query

        return query(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            slurm.run(["scancel", *job_ids], what="cancelling")

    def requeue_refusal(self, run_dir: Path) -> str | None:
        return None

    def requeue(self, job_id: str, what: str) -> None:
        slurm.run(["scontrol", "requeue", job_id], what=what)

    def signal(self, job_id: str, signal: str, what: str) -> None:
        slurm.run(["scancel", f"--signal={signal}", job_id], what=what)

    def find(self, run_dir: Path, entries: list[dict[str, Any]], since: str) -> dict[str, list[str]]:
        """Job ids Slurm holds for each entry (by name), found by the tag in its --comment (squeue, for the
        jobs the controller remembers) or by its script in the submit line (sacct, with accounting).
        Array tasks come as "<array id>_<task>". Raises SubmitError when Slurm answers neither way."""
        from jobgen.build.render import submit_tag

        tags = {submit_tag(run_dir.name, e["name"]): e["name"] for e in entries}
        scripts = {str(run_dir / e["script"]): e["name"] for e in entries}
        found: dict[str, list[str]] = {}

        def add(name: str | None, job_id: str) -> None:
            if name and job_id not in found.setdefault(name, []):
                found[name].append(job_id)

        queue = slurm.ask(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%k"])
        for line in queue.splitlines() if queue is not None else []:
            job_id, _, comment = line.partition("|")
            add(tags.get(comment.split(" ", 1)[0]), job_id.strip())
        start = dt.datetime.fromisoformat(since).astimezone() - dt.timedelta(hours=1)
        acct = slurm.ask(["sacct", "-n", "-P", "-X", "--format=JobID,Comment,SubmitLine",
                          "-S", start.strftime("%Y-%m-%dT%H:%M:%S")])  # fmt: skip
        for line in acct.splitlines() if acct is not None else []:
            job_id, _, rest = line.partition("|")
            comment, _, submit_line = rest.partition("|")
            script = next((path for path in scripts if submit_line.endswith(path)), None)
            add(tags.get(comment.split(" ", 1)[0]) or scripts.get(script or ""), job_id.strip())
        if queue is None and acct is None:
            raise SubmitError("cannot tell which jobs Slurm already holds (squeue and sacct did not answer); "
                              "nothing was submitted again: run the command again once Slurm answers")  # fmt: skip
        return found

    def shape_problems(self, exp: Experiment) -> list[str]:
        if exp.train.accelerator == "gpu" and not exp.slurm.gpus_per_node:
            return ["train.accelerator = 'gpu' but slurm.gpus_per_node = 0: ask for GPUs or use accelerator 'auto'"]
        return []
