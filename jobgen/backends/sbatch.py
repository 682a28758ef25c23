"""Submit rendered scripts with `sbatch --parsable`, an argument list, never a shell."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from jobgen.errors import BackendError, SubmitError
from jobgen.record import now_iso
from jobgen.states import State

_JOB_ID = re.compile(r"(\d+)(?:;\S+)?")
# How long sbatch may take to answer; a busy controller can be slow (env: JOBGEN_SBATCH_TIMEOUT).
SUBMIT_TIMEOUT_S = float(os.environ.get("JOBGEN_SBATCH_TIMEOUT") or 60)
FIND_TIMEOUT_S = 30


class SbatchBackend:
    name = "sbatch"

    def submit_command(self, script: Path) -> list[str]:
        return ["sbatch", "--parsable", str(script)]

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        return {"job_id": submit(job["submit_command"], f"submitting {job['name']}"), "state": State.SUBMITTED.value,
                "submitted_at": now_iso()}  # fmt: skip

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

    def find(self, run_dir: Path, entries: list[dict[str, Any]], since: str) -> dict[str, list[str]]:
        """Job ids Slurm holds for each entry (by name), found by the tag in its --comment (squeue, for the
        jobs the controller remembers) or by its script in the submit line (sacct, with accounting).
        Array tasks come as "<array id>_<task>". Raises SubmitError when Slurm answers neither way."""
        from jobgen.render import submit_tag

        tags = {submit_tag(_run_id(run_dir), e["name"]): e["name"] for e in entries}
        scripts = {str(run_dir / e["script"]): e["name"] for e in entries}
        found: dict[str, list[str]] = {}

        def add(name: str | None, job_id: str) -> None:
            if name and job_id not in found.setdefault(name, []):
                found[name].append(job_id)

        queue = call_quietly(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%k"])
        for line in queue.splitlines() if queue is not None else []:
            job_id, _, comment = line.partition("|")
            add(tags.get(comment.split(" ", 1)[0]), job_id.strip())
        start = dt.datetime.fromisoformat(since).astimezone() - dt.timedelta(hours=1)
        acct = call_quietly(["sacct", "-n", "-P", "-X", "--format=JobID,Comment,SubmitLine",
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


def test_only(script: Path) -> tuple[bool, str]:
    """Ask sbatch whether it would accept a script, and when it would start; submits nothing."""
    try:
        done = call_tool(["sbatch", "--test-only", str(script)], timeout=SUBMIT_TIMEOUT_S, what="asking")
    except SubmitError as exc:
        return False, exc.message
    return done.returncode == 0, _words(done)


def _run_id(run_dir: Path) -> str:
    return run_dir.name


def call_quietly(command: list[str]) -> str | None:
    """A Slurm query's output, or None when the tool is missing, fails or does not answer."""
    try:
        done = call_tool(command, timeout=FIND_TIMEOUT_S, what="asking")
    except (SubmitError, BackendError):
        return None
    return done.stdout if done.returncode == 0 else None


# What Slurm's clients print when the controller did not answer (as opposed to refusing).
UNREACHABLE = ("Unable to contact slurm controller", "did not answer", "Socket timed out", "Connection refused",
               "Transport endpoint", "Zero Bytes were transmitted")  # fmt: skip


def submit(command: list[str], what: str) -> str:
    """Run an sbatch command; the job id. A SubmitError says whether the job may be queued all the same."""
    done = call_tool(command, timeout=SUBMIT_TIMEOUT_S, what=what)
    if done.returncode != 0:
        words = _words(done)
        raise SubmitError(f"{what}: {command[0]} failed: {words}", maybe_queued=any(s in words for s in UNREACHABLE))
    return parse_job_id(done.stdout)


def parse_job_id(output: str) -> str:
    """sbatch --parsable prints "<id>" or "<id>;<cluster>"; anything else is an error we show whole."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    match = _JOB_ID.fullmatch(lines[-1]) if lines else None
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
    # In its own session, so that a tool that hangs is stopped with everything it started (a wrapper's
    # children would otherwise keep its pipes open, and us waiting).
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True, start_new_session=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise SubmitError(f"{what}: {command[0]} did not answer in {timeout:.0f} s; is slurmctld up?") from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _words(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
