"""Run jobs on this machine, one after another, with live output: no Slurm needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from jobgen.record import now_iso
from jobgen.states import State

LOG_NAME = "local.out"


class LocalBackend:
    name = "local"

    def submit_command(self, script: Path) -> list[str]:
        return ["bash", str(script)]

    def find(self, run_dir: Path, entries: list[dict[str, Any]], since: str) -> dict[str, list[str]]:
        """Local jobs have no ids to find: one that was started is recorded before it runs."""
        return {}

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        log_path = run_dir / job["dir"] / LOG_NAME
        started = now_iso()
        try:
            code = _run_teed(job["submit_command"], log_path)
        except KeyboardInterrupt:
            return {"state": State.CANCELLED.value, "submitted_at": started, "ended_at": now_iso(), "exit_code": None}
        state = State.COMPLETED if code == 0 else State.FAILED
        return {"state": state.value, "submitted_at": started, "ended_at": now_iso(), "exit_code": code}

    def cancel(self, job_ids: list[str]) -> None:
        return None


def _run_teed(command: list[str], log_path: Path) -> int:
    """Run a command, copying its output line by line to our stdout and to a log file."""
    with open(log_path, "ab") as log, subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    ) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
