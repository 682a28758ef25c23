"""The one way jobgen calls Slurm's command-line tools (sbatch, squeue, sacct, scontrol, scancel).

Every call: an argument list (never a shell), a timeout after which the tool and everything it started
are killed, a one-line error that names the tool when it is missing or does not answer, and the tool's
own words when it refuses.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import time

from jobgen.errors import BackendError, SubmitError

# How long sbatch & co. may take to answer; a busy controller can be slow (env: JOBGEN_SBATCH_TIMEOUT).
SUBMIT_TIMEOUT_S = float(os.environ.get("JOBGEN_SBATCH_TIMEOUT") or 60)
# Queries (squeue, sacct, scontrol show) have a fallback, so they give up sooner.
QUERY_TIMEOUT_S = 30

# What Slurm's clients print when the controller did not answer (as opposed to refusing).
UNREACHABLE = (
    "Unable to contact slurm controller",
    "did not answer",
    "Socket timed out",
    "Connection refused",
    "Transport endpoint",
    "Zero Bytes were transmitted",
)
# What sbatch prints, and then sleeps and retries for a minute or more, when the controller holds
# MaxJobCount jobs already (jobgen.backends._queue).
BUSY = "temporarily unable to accept job"
# `scontrol show config` needs the controller; a login node without one should not wait long.
CONFIG_TIMEOUT_S = 10
_JOB_ID = re.compile(r"(\d+)(?:;\S+)?")


def call(command: list[str], *, timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client and return what it did, whatever its exit code; a missing tool or no answer
    is an error."""
    if shutil.which(command[0]) is None:
        raise BackendError(
            f"{command[0]} not found on PATH; run this on a Slurm login node (or use launch.backend = 'local')"
        )
    return _answer(_start(command), command, timeout=timeout, what=what)


def _start(command: list[str]) -> subprocess.Popen[str]:
    # In its own session, so that a tool that hangs is stopped with everything it started (a wrapper's
    # children would otherwise keep its pipes open, and us waiting).
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _answer(
    proc: subprocess.Popen[str], command: list[str], *, timeout: float, what: str
) -> subprocess.CompletedProcess[str]:
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise _no_answer(proc, command, what, timeout) from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _no_answer(proc: subprocess.Popen[str], command: list[str], what: str, timeout: float) -> SubmitError:
    """Stop a tool that did not answer in time, with everything it started; the error that says so."""
    os.killpg(proc.pid, signal.SIGKILL)
    return SubmitError(f"{what}: {command[0]} did not answer in {timeout:.0f} s; is slurmctld up?")


def run(command: list[str], *, what: str, timeout: float | None = None) -> str:
    """Run a Slurm client that must succeed; its output. Errors carry the tool's own words on one line."""
    done = call(command, timeout=SUBMIT_TIMEOUT_S if timeout is None else timeout, what=what)
    if done.returncode != 0:
        raise SubmitError(f"{what}: {command[0]} failed: {words(done)}")
    return done.stdout


def ask(command: list[str], timeout: float = QUERY_TIMEOUT_S) -> str | None:
    """A query's output, or None when the tool is missing, fails or does not answer (callers fall back)."""
    return ask_why(command, timeout)[0]


def ask_why(command: list[str], timeout: float = QUERY_TIMEOUT_S) -> tuple[str | None, str]:
    """(the query's output, "") or (None, why there is none): "" when the tool is missing (no Slurm
    here: nothing to ask), else what the tool said when it failed or did not answer in time, on one line."""
    if shutil.which(command[0]) is None:
        return None, ""
    try:
        done = _answer(_start(command), command, timeout=timeout, what="asking")
    except SubmitError as exc:
        return None, exc.message.removeprefix("asking: ")
    if done.returncode != 0:
        return None, f"{command[0]} failed: {words(done)}"
    return done.stdout, ""


def show_config() -> dict[str, str] | None:
    """`scontrol show config` as key -> value; None when scontrol is missing, fails or does not answer."""
    out = ask(["scontrol", "show", "config"], timeout=CONFIG_TIMEOUT_S)
    if out is None:
        return None
    pairs = (line.partition("=") for line in out.splitlines())
    return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip()}


def cluster_name() -> str | None:
    """This cluster's name (ClusterName in `scontrol show config`); None when scontrol is missing, fails
    or does not say (jobgen.experiment.sites picks the site by it)."""
    return (show_config() or {}).get("ClusterName") or None


def submit(command: list[str], what: str) -> str:
    """Run an sbatch command; the job id. A SubmitError says whether the job may be queued all the same
    (jobgen.backends._queue.submit also names the queue limit that refused it)."""
    done = _submit_call(command, what)
    if done.returncode != 0:
        said = words(done)
        # sbatch stopped while it retried a busy controller: it may have been between two tries, or in one.
        raise SubmitError(f"{what}: {command[0]} failed: {said}", maybe_queued=unreachable(said) or BUSY in said)
    return parse_job_id(done.stdout)


def _submit_call(command: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """call(), but sbatch is stopped as soon as it says the controller will not take the job now: it
    would sleep and retry for minutes (MaxJobCount reached), and the cause, not a timeout, is the answer."""
    if shutil.which(command[0]) is None:
        return call(command, timeout=SUBMIT_TIMEOUT_S, what=what)
    proc = _start(command)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    said = {out: b"", err: b""}
    busy = BUSY.encode()
    deadline = time.monotonic() + SUBMIT_TIMEOUT_S
    with proc, selectors.DefaultSelector() as sel:
        for fd in said:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and busy not in said[err]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _no_answer(proc, command, what, SUBMIT_TIMEOUT_S)
            for key, _ in sel.select(min(left, 1.0)):
                data = os.read(int(key.fd), 65536)
                said[int(key.fd)] += data
                if not data:
                    sel.unregister(key.fd)
        if busy in said[err]:
            os.killpg(proc.pid, signal.SIGKILL)
            code, said[out] = 1, b""
        else:
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise _no_answer(proc, command, what, SUBMIT_TIMEOUT_S) from None
    return subprocess.CompletedProcess(
        command, code, said[out].decode(errors="replace"), said[err].decode(errors="replace")
    )


def unreachable(message: str) -> bool:
    """The tool's words say the controller did not answer (the request may or may not have happened)."""
    return any(sign in message for sign in UNREACHABLE)


def parse_job_id(output: str) -> str:
    """sbatch --parsable prints "<id>" or "<id>;<cluster>"; anything else is an error we show whole."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    match = _JOB_ID.fullmatch(lines[-1]) if lines else None
    if not match:
        raise SubmitError(f"sbatch printed no job id: {output.strip()!r}")
    return match.group(1)


def words(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
