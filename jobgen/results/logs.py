"""The one log reader: which files are a job's logs (its scheduler says), their lines with the rank
labels of srun (`3: text`) and torchrun (`[rank3]: text`) made readable, and their tails.

`jobgen logs`, the failure diagnosis (jobgen.results.diagnose) and the HTML report all read logs here.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from jobgen import backends
from jobgen.backends._base import oldest_first
from jobgen.errors import JobgenError
from jobgen.record.model import RunJob

# srun --label: "<task>: "; torchrun/accelerate --tee: "[rank<n>]: ", possibly after srun's label (one
# launcher task per node). The last label is the rank that wrote the line.
_LABEL = re.compile(r"^\s*((?:\d+: ?|\[rank\d+\]: ?)+)(.*)$", re.DOTALL)
_RANK = re.compile(r"\d+")
# A log can be gigabytes; the cause of death is at its end.
TAIL_BYTES = 256 * 1024


def files(backend: str, job_dir: Path, stream: str | None = None) -> list[Path]:
    """A job's log files of one stream ('out', 'err'; None: both), oldest first. An unknown backend
    (a damaged manifest) gets every scheduler's kinds of log."""
    try:
        scheduler = backends.get(backend)
    except JobgenError:
        found = {p for name in backends.names() for p in backends.get(name).log_files(job_dir, stream)}
        return sorted(found, key=oldest_first)
    return scheduler.log_files(job_dir, stream)  # oldest first already


def of(job: RunJob, backend: str) -> list[Path]:
    """files() of both streams of a job the command read, listed once per command (the report links them,
    and they tell why the job stopped)."""
    if job.log_paths is None:
        job.log_paths = files(backend, job.job_dir)
    return job.log_paths


def label(line: str, rank: int | None) -> str | None:
    """'3: text' (srun --label) or '[rank3]: text' (torchrun) -> '[rank 3] text'; None when filtering
    out another rank."""
    match = _LABEL.match(line)
    if not match:
        return line if rank is None else None
    writer = int(_RANK.findall(match.group(1))[-1])
    if rank is not None and writer != rank:
        return None
    return f"[rank {writer}] {match.group(2)}"


def ranks(paths: list[Path]) -> list[int]:
    """The ranks that wrote labelled lines in these logs, in order."""
    found: set[int] = set()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            found |= {int(_RANK.findall(m.group(1))[-1]) for line in fh if (m := _LABEL.match(line))}
    return sorted(found)


def strip_label(line: str) -> str:
    """The line without its rank labels."""
    match = _LABEL.match(line)
    return match.group(2) if match else line


def tail_lines(path: Path) -> list[str]:
    """The non-blank lines of a log's last TAIL_BYTES, without rank labels, stripped."""
    data = _tail_bytes(path)
    if data is None:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return [strip_label(ln).strip() for ln in lines if ln.strip()]


def _tail_bytes(path: Path | str) -> bytes | None:
    """The log's last TAIL_BYTES (None: it cannot be read), read from the offset its size gives."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        parts: list[bytes] = []
        offset = max(0, size - TAIL_BYTES)
        while True:  # to its end, as it is now (a log still written to may have grown since the fstat)
            part = os.pread(fd, TAIL_BYTES, offset)
            if not part:
                return b"".join(parts)
            parts.append(part)
            offset += len(part)
    except OSError:
        return None
    finally:
        os.close(fd)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def tail(path: Path, count: int) -> list[str]:
    """A log's last `count` lines as a reader wants them: rank labels made readable, colour codes
    dropped, and of a progress bar redrawn with carriage returns only its last state."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = [_ANSI.sub("", ln).rstrip("\r").rsplit("\r", 1)[-1] for ln in data.decode("utf-8", "replace").split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return [label(ln, None) or ln for ln in lines[-count:]]


def read_lines(paths: list[Path], rank: int | None) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                shown = label(line.rstrip("\n"), rank)
                if shown is not None:
                    yield shown


def follow(
    path_of: Callable[[], list[Path]],
    rank: int | None,
    finished: Callable[[], bool],
    poll_s: float = 1.0,
    timeout_s: float | None = None,
) -> Iterator[str]:
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
