"""A job's output: Slurm's .out/.err (or local.out), with srun's rank labels made readable."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$", re.DOTALL)


def pick_job(manifest: dict[str, Any], name: str | None) -> dict[str, Any]:
    jobs = manifest["jobs"]
    if name is None:
        if len(jobs) == 1:
            return jobs[0]
        raise JobgenError(f"this run has {len(jobs)} jobs; name one: {', '.join(j['name'] for j in jobs)}")
    for job in jobs:
        if name in (job["name"], job.get("job_id"), *job.get("previous_job_ids", ())):
            return job
    raise JobgenError(f"no job {name!r} in this run; jobs: {', '.join(j['name'] for j in jobs)}")


def log_files(run_dir: Path, job: dict[str, Any], stream: str) -> list[Path]:
    """The job's log files for a stream ('out' or 'err'), oldest first."""
    folder = run_dir / job["dir"]
    if stream == "out" and (folder / "local.out").exists():
        return [folder / "local.out"]
    return sorted(folder.glob(f"slurm-*.{stream}"), key=lambda p: p.stat().st_mtime)


def label(line: str, rank: int | None) -> str | None:
    """'3: text' (srun --label) -> '[rank 3] text'; None when filtering out another rank."""
    match = _LABEL.match(line)
    if not match:
        return line if rank is None else None
    if rank is not None and int(match.group(1)) != rank:
        return None
    return f"[rank {match.group(1)}] {match.group(2)}"


def read_lines(paths: list[Path], rank: int | None) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                shown = label(line.rstrip("\n"), rank)
                if shown is not None:
                    yield shown


def follow(path_of: Callable[[], list[Path]], rank: int | None, finished: Callable[[], bool],
           poll_s: float = 1.0, timeout_s: float | None = None) -> Iterator[str]:
    """Yield lines as they are written until the job is finished (and the file drained) or timeout."""
    offsets: dict[Path, int] = {}
    started = time.monotonic()
    while True:
        done = finished()
        for path in path_of():
            with open(path, "rb") as fh:
                fh.seek(offsets.get(path, 0))
                chunk = fh.read()
            # Only whole lines: a line still being written is read on the next pass.
            cut = len(chunk) if done else chunk.rfind(b"\n") + 1
            offsets[path] = offsets.get(path, 0) + cut
            for line in chunk[:cut].decode("utf-8", errors="replace").splitlines():
                shown = label(line, rank)
                if shown is not None:
                    yield shown
        if done or (timeout_s is not None and time.monotonic() - started > timeout_s):
            return
        time.sleep(poll_s)
