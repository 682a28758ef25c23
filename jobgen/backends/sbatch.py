"""Submit rendered scripts with `sbatch --parsable`, an argument list, never a shell."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from jobgen.errors import BackendError, SubmitError
from jobgen.record import now_iso
from jobgen.states import State

_JOB_ID = re.compile(r"^(\d+)(?:;\S+)?$")
SUBMIT_TIMEOUT_S = 60


class SbatchBackend:
    name = "sbatch"

    def submit_command(self, script: Path) -> list[str]:
        return ["sbatch", "--parsable", str(script)]

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        command = job["submit_command"]
        output = run_tool(command, timeout=SUBMIT_TIMEOUT_S, what=f"submitting {job['name']}")
        return {"job_id": parse_job_id(output), "state": State.SUBMITTED.value, "submitted_at": now_iso()}

    def submit_chain(self, run_dir: Path, job: dict[str, Any], segments: int) -> dict[str, Any]:
        """Submit one job as `segments` copies of its script, each queued to start when the one before it
        ends, however it ends (afterany: afterok never fires after a TIMEOUT)."""
        ids = [self.submit(run_dir, job)["job_id"]]
        command = job["submit_command"]
        for n in range(2, segments + 1):
            after = [*command[:-1], f"--dependency=afterany:{ids[-1]}", command[-1]]
            output = run_tool(after, timeout=SUBMIT_TIMEOUT_S, what=f"submitting segment {n} of {job['name']}")
            ids.append(parse_job_id(output))
        return {"job_id": ids[0], "segments": ids, "state": State.SUBMITTED.value, "submitted_at": now_iso()}

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_tool(["scancel", *job_ids], timeout=SUBMIT_TIMEOUT_S, what="cancelling")


def test_only(script: Path) -> tuple[bool, str]:
    """Ask sbatch whether it would accept a script, and when it would start; submits nothing."""
    try:
        done = call_tool(["sbatch", "--test-only", str(script)], timeout=SUBMIT_TIMEOUT_S, what="asking")
    except SubmitError as exc:
        return False, exc.message
    return done.returncode == 0, _words(done)


def parse_job_id(output: str) -> str:
    """sbatch --parsable prints "<id>" or "<id>;<cluster>"; anything else is an error we show whole."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    match = _JOB_ID.match(lines[-1]) if lines else None
    if not match:
        raise SubmitError(f"sbatch printed no job id: {output.strip()!r}")
    return match.group(1)


def run_tool(command: list[str], *, timeout: float, what: str) -> str:
    """Run a Slurm client; errors carry the tool's own words on one line."""
    done = call_tool(command, timeout=timeout, what=what)
    if done.returncode != 0:
        raise SubmitError(f"{what}: {command[0]} failed: {_words(done)}")
    return done.stdout


def call_tool(command: list[str], *, timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client and return what it did, whatever its exit code; a missing tool or no answer
    is an error."""
    if shutil.which(command[0]) is None:
        raise BackendError(f"{command[0]} not found on PATH; run this on a Slurm login node (or use launch.backend = 'local')")
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what}: {command[0]} did not answer in {timeout:.0f} s; is slurmctld up?") from None


def _words(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
