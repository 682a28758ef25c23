"""Job -> spec.json: everything the training entrypoint needs, resolved to absolute paths.

Only the experiment's own values go in: never the submitting environment (tokens stay there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobgen.experiment.config import as_dict, model_path
from jobgen.facts import SPEC_SCHEMA, signal_name
from jobgen.plan import container
from jobgen.plan.plan import Job
from jobgen.plan.render import RunInfo


def build_spec(job: Job, run: RunInfo, cache_dir: Path) -> dict[str, Any]:
    exp = job.exp
    data = as_dict(exp.data)
    data["files"] = {role: str((exp.base_dir / rel).resolve()) for role, rel in exp.data.files.items()}
    local = model_path(exp.train.model, exp.base_dir)
    train = as_dict(exp.train) | {"model": str(local.resolve()) if local else exp.train.model}
    return {
        "schema": SPEC_SCHEMA,
        "experiment": exp.name,
        "job": job.name,
        "sweep": job.sweep,
        "run_dir": str(run.run_dir),
        "job_dir": str(run.job_dir(job)),
        "cache_dir": str(cache_dir),
        "train": train,
        "data": data,
        "slurm": as_dict(exp.slurm),
        "env": as_dict(exp.env),
        "container": container.record(job) or {},
        "requeue": {
            "enabled": exp.slurm.requeue,
            "signal": signal_name(exp.slurm.signal),
            "signal_seconds": exp.slurm.signal_seconds,
        },
    }
