"""local: run the jobs on this machine, one after another, with live output: no Slurm needed."""

from __future__ import annotations

import contextlib
import contextvars
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobgen.backends._base import Scheduler
from jobgen.facts import JobShape, identity, now_iso
from jobgen.states import State
from training.halving import EXIT_PAUSED, paused_since

LOG_NAME = "local.out"
# The manifest entry's field: wall-clock seconds the job ran on this machine, every run of it together
# (a local job holds no allocation: these are its hours in a halving summary's totals).
RAN_S = "ran_s"
# Whether a job's output is copied to our stdout as it runs (the CLI) or only to its log (jobgen.api).
_ECHO = contextvars.ContextVar("jobgen_local_echo", default=True)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Jobs run inside this write their output to their log only, not to stdout."""
    token = _ECHO.set(False)
    try:
        yield
    finally:
        _ECHO.reset(token)


class Local(Scheduler):
    name = "local"
    doc = "run the jobs on this machine, one after another"
    template = "local.sh.j2"
    script_name = "job.sh"
    logs = {"out": (LOG_NAME,)}
    runs_here = True

    def python(self) -> str:
        return sys.executable  # the jobs run with this very interpreter

    def submit_command(self, script: Path) -> list[str]:
        return ["bash", str(script)]

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        """Run the job here, to its end; its entry's new fields. RAN_S adds this run's wall-clock seconds
        to those of the job's earlier runs (a halving job promoted after its pause runs again)."""
        log_path = run_dir / job["dir"] / LOG_NAME
        result = run_dir / job["dir"] / "result.json"
        result_before = identity(result)
        started, tick, wall = now_iso(), time.monotonic(), time.time()
        before = job.get(RAN_S)
        before = float(before) if isinstance(before, (int, float)) and not isinstance(before, bool) else 0.0

        def ran() -> float:
            return round(before + time.monotonic() - tick, 3)

        try:
            code = _run_teed(job["submit_command"], log_path)
        except KeyboardInterrupt:
            return {
                "state": State.CANCELLED.value,
                "submitted_at": started,
                "ended_at": now_iso(),
                "exit_code": None,
                RAN_S: ran(),
            }
        # A job paused at a halving rung ended as planned, without a result (the state rule then shows it
        # as paused, jobgen.results.halving): not a failure. A launcher (torchrun) reports its ranks'
        # pause as a failure of its own: the pause marker this run wrote says what they meant.
        paused = code == EXIT_PAUSED or (code != 0 and paused_since(run_dir / job["dir"] / "checkpoints", wall))
        # As the batch script's guard (templates/_result_guard.j2): a run that wrote its result and then
        # died on the way out lost no work.
        wrote = code != 0 and not paused and identity(result) not in (None, result_before)
        if wrote:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            with open(log_path, "a") as log:
                print(
                    f"jobgen: the training wrote {result}, then {how} on the way out; the job counts as completed",
                    file=log,
                )
        state = State.COMPLETED if code == 0 or paused or wrote else State.FAILED
        return {"state": state.value, "submitted_at": started, "ended_at": now_iso(), "exit_code": code, RAN_S: ran()}

    def requeue_refusal(self, run_dir: Path) -> str | None:
        return (
            f"{run_dir} ran with the local backend; requeue is for Slurm runs "
            "(run the experiment again to repeat a local run)"
        )

    def shape_problems(self, shape: JobShape) -> list[str]:
        if shape.nodes > 1:
            return [
                f"launch.backend = 'local' runs on this machine but slurm.nodes = {shape.nodes}; use 1 node or sbatch"
            ]
        return []


def _run_teed(command: list[str], log_path: Path) -> int:
    """Run a command, copying its output line by line to our stdout and to a log file."""
    with (
        open(log_path, "ab") as log,
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) as proc,
    ):
        try:
            assert proc.stdout is not None
            echo = _ECHO.get()
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise


SCHEDULER = Local()
