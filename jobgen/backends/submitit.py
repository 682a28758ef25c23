"""Submit the same jobs through submitit: resources mapped from the experiment, same run directory.

submitit writes its own sbatch script and srun line; each task runs the training entrypoint as a
command, after sourcing the job's setup file (jobgen's environment and rendezvous).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from jobgen.backends import _queue
from jobgen.backends._slurm import SlurmScheduler, extra_options, resource_options
from jobgen.errors import BackendError, SubmitError
from jobgen.facts import JobShape, now_iso, time_minutes
from jobgen.states import State
from training.halving import PAUSED_EXIT_ENV


class Submitit(SlurmScheduler):
    """submitit writes the sbatch script and the srun line; jobgen renders the setup file it sources.
    Following, cancelling and requeueing are Slurm's, as for sbatch."""

    name = "submitit"
    doc = "submitit writes and submits the batch script; jobgen's setup file gives it the environment"
    template = "setup.sh.j2"
    script_name = "setup.sh"
    # submitit's own names: <job id>_<task>_log.out|err in its folder.
    logs = {"out": ("submitit/*_log.out",), "err": ("submitit/*_log.err",)}

    def submit_command(self, script: Path) -> list[str]:
        """What submitit will run in every task (after sourcing `script`), for the record."""
        folder, spec = script.parent / "submitit", script.parent / "spec.json"
        return ["submitit", f"--folder={folder}", "python", "-u", "-m", "training", "--spec", str(spec)]

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        try:
            import submitit
            from submitit.helpers import CommandFunction
        except ImportError as exc:
            raise BackendError(f"the submitit backend needs submitit: pip install 'jobgen[submitit]' ({exc})") from None

        spec_path = run_dir / job["spec"]
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        folder = run_dir / job["dir"] / "submitit"
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        # [container]: the partial's srun flags (pyxis) and the words before the task's python (apptainer,
        # charliecloud), as jobgen rendered them into the manifest.
        wrap = job.get("container") or {"srun_flags": [], "command": []}
        executor.update_parameters(**executor_parameters(spec, run_dir / job["script"], wrap["srun_flags"]))
        python = spec["env"]["python"] or ("python" if job.get("container") else sys.executable)
        task = [*wrap["command"], python, "-u", "-m", "training", "--spec", str(spec_path)]
        command = CommandFunction(task, verbose=True)
        try:
            submitted = executor.submit(command)
        except Exception as exc:  # submitit wraps sbatch's failure in its own types
            said = " ".join(str(exc).split())
            qos, account = str(spec["slurm"].get("qos") or ""), str(spec["slurm"].get("account") or "")
            cause = _queue.refusal(said, f"submitting {job['name']}", qos, account)
            raise SubmitError(cause or f"submitit: {said}") from None
        script = folder / f"{submitted.job_id}_submission.sh"
        return {
            "job_id": str(submitted.job_id),
            "state": State.SUBMITTED.value,
            "submitted_at": now_iso(),
            "submitit_script": str(script.relative_to(run_dir)) if script.exists() else None,
        }

    def shape_problems(self, shape: JobShape) -> list[str]:
        problems = super().shape_problems(shape)
        if shape.requeue:
            problems.append(
                "slurm.requeue is jobgen's own signal handling in sbatch scripts; submitit has its own: "
                "use launch.backend = 'sbatch' for requeue"
            )
        if shape.launcher != "srun":
            problems.append(
                f"launch.launcher = {shape.launcher!r} needs launch.backend 'sbatch' or 'local': "
                "submitit starts one task per GPU itself"
            )
        return problems


SCHEDULER = Submitit()


# sbatch's options in submitit's words; the rest go to slurm_additional_parameters as they are.
SUBMITIT_NAMES = {
    "nodes": "nodes",
    "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task",
    "gpus-per-node": "gpus_per_node",
    "partition": "slurm_partition",
    "account": "slurm_account",
    "qos": "slurm_qos",
    "mem": "slurm_mem",
    "constraint": "slurm_constraint",
    "exclusive": "slurm_exclusive",
}
INTEGERS = frozenset({"nodes", "tasks_per_node", "cpus_per_task"})


def executor_parameters(spec: dict[str, Any], setup_file: Path, srun_flags: list[str] | None = None) -> dict[str, Any]:
    """The experiment's resources (the same mapping as sbatch scripts: resource_options) in submitit's words."""
    setup = [f"source {shlex.quote(str(setup_file))}"]
    if spec.get("halving"):
        # A job paused at a halving rung ended as planned (no batch script of jobgen's reads its marker
        # here): status 0, or submitit records a failure and Slurm a FAILED job.
        setup.append(f"export {PAUSED_EXIT_ENV}=0")
    params: dict[str, Any] = {
        "name": f"{spec['experiment']}.{spec['job']}",
        "slurm_setup": setup,
        "slurm_srun_args": ["--label", "--kill-on-bad-exit=1", *(srun_flags or [])],
    }
    for flag, value in resource_options(spec["slurm"]):
        if flag == "time":
            params["timeout_min"] = time_minutes(str(value))
            continue
        name = SUBMITIT_NAMES[flag]
        params[name] = True if value is None else int(value) if name in INTEGERS else value
    if isinstance(params.get("gpus_per_node"), str) and params["gpus_per_node"].isdigit():
        params["gpus_per_node"] = int(params["gpus_per_node"])
    extra = extra_options(spec["slurm"]["extra"])
    if extra:
        params["slurm_additional_parameters"] = {flag.replace("-", "_"): value for flag, value in extra}
    return params
