"""`jobgen prefetch`: on the login node, fetch what an experiment's jobs will need before they run.

Compute nodes often have no internet, so jobs run with HF_HUB_OFFLINE=1 (env.hf_offline). This runs
the training entrypoint's own data step (`python -m training --prepare-only`) here, once per distinct
model and data of the sweep: the dataset and model weights land in the Hugging Face cache, the
tokenized splits (and a built-in tiny model) in the run cache the jobs read. It needs the training
stack installed where it runs; `jobgen submit` itself does not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from jobgen.commands.submit import load_experiment, output_root_of
from jobgen.errors import JobgenError
from jobgen.plan.plan import cache_dir_for, plan
from jobgen.plan.render import RunInfo
from jobgen.plan.spec import build_spec

# Offline switches a login shell may carry over from job scripts; prefetching exists to go online.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def prefetch(
    path: str | Path, output_root: Path | None, sets: list[str], site: str | None = None
) -> tuple[int, int, Path]:
    """Prepare every distinct (model, data, seed) of the experiment; returns (prepared, jobs, cache dir)."""
    exp = load_experiment(path, sets=sets, site=site)
    jobs = plan(exp)
    missing = [m for m in ("torch", "transformers", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        raise JobgenError(
            f"prefetch runs the training data step here and needs {', '.join(missing)}: pip install 'jobgen[train]'"
        )
    root = output_root_of(exp, output_root)
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARS}
    done: set[str] = set()
    cache = cache_dir_for(jobs[0], root)
    with tempfile.TemporaryDirectory(prefix="jobgen-prefetch-") as tmp:
        run = RunInfo(run_id="prefetch", run_dir=Path(tmp))
        for job in jobs:
            spec = build_spec(job, run, cache_dir_for(job, root))
            key = json.dumps(
                [spec["train"]["model"], spec["data"], spec["train"]["seed"], spec["cache_dir"]], sort_keys=True
            )
            if key in done:
                continue
            done.add(key)
            spec_path = Path(tmp) / f"{job.name}.json"
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            command = [sys.executable, "-u", "-m", "training", "--spec", str(spec_path), "--prepare-only"]
            rc = subprocess.run(command, env=env, cwd=tmp).returncode
            if rc != 0:
                raise JobgenError(f"prefetch for job {job.name} failed (exit {rc}); its output is above")
    return len(done), len(jobs), cache
