"""sbatch: jobgen renders each job's batch script and submits it with `sbatch --parsable`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobgen.backends import _queue
from jobgen.backends import _tools as slurm
from jobgen.backends._slurm import SlurmScheduler
from jobgen.errors import SubmitError
from jobgen.facts import now_iso
from jobgen.states import State


class Sbatch(SlurmScheduler):
    name = "sbatch"
    doc = "jobgen writes the batch script and submits it with sbatch"
    template = "srun.sbatch.j2"
    script_name = "job.sbatch"
    can_chain = True
    can_array = True
    can_test_only = True
    can_retry = True
    can_wave = True

    def submit_command(self, script: Path) -> list[str]:
        return ["sbatch", "--parsable", str(script)]

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        return {
            "job_id": _queue.submit(job["submit_command"], f"submitting {job['name']}"),
            "state": State.SUBMITTED.value,
            "submitted_at": now_iso(),
        }

    def submit_chain(self, run_dir: Path, job: dict[str, Any], segments: int) -> dict[str, Any]:
        """Submit one job as `segments` copies of its script, each queued to start when the one before it
        ends, however it ends (afterany: afterok never fires after a TIMEOUT)."""
        ids = [self.submit(run_dir, job)["job_id"]]
        command = job["submit_command"]
        for n in range(2, segments + 1):
            after = [*command[:-1], f"--dependency=afterany:{ids[-1]}", command[-1]]
            ids.append(_queue.submit(after, f"submitting segment {n} of {job['name']}"))
        return {"job_id": ids[0], "segments": ids, "state": State.SUBMITTED.value, "submitted_at": now_iso()}

    def submit_array_task(self, run_dir: Path, array: dict[str, Any], index: int, what: str) -> str:
        command = ["sbatch", "--parsable", f"--array={index}", str(run_dir / array["script"])]
        return f"{_queue.submit(command, what)}_{index}"

    def test_only(self, script: Path) -> tuple[bool, str]:
        """Ask sbatch whether it would accept a script, and when it would start; submits nothing."""
        try:
            done = slurm.call(["sbatch", "--test-only", str(script)], timeout=slurm.SUBMIT_TIMEOUT_S, what="asking")
        except SubmitError as exc:
            return False, exc.message
        return done.returncode == 0, slurm.words(done)


SCHEDULER = Sbatch()
