"""Reading the records of many jobs in several processes.

A first `status`, `summary` or `report` of 10,000 ended jobs reads and checks 20,000 records, about
60 µs of Python a job: one core's second. A login node has cores to spare, so the jobs are split into
contiguous shares and each share but the first is read by a forked process, which hands back what it
learnt (RunJob.seen: the listing, stamps and damage verdicts, no bytes) and the facts it kept in the
run's verdicts (Verdicts.changed); this process reads the first share meanwhile, then takes the others'.
Nothing a reader hands back differs from what this process would have learnt itself: a reader that
fails, dies or hands back what cannot be read has its share read here.

The readers are forked before jobgen starts a thread (`share` is called before the scheduler is asked
in one), never while one of its threads runs, and by default only from a process without other
threads (the CLI); a reader does nothing but read files and write one pipe, then leaves with os._exit
(no atexit work, no buffered output flushed twice).

`JOBGEN_READERS=N` sets how many processes read (1: this one alone). By default, one per 2,500 jobs
to read, at most one per core this process may run on (and its control groups' CPU quota lets it
use), at most 8; a job whose folder is as an earlier command saw it counts a quarter (its folder and
records are stat'ed, and read only if they changed): a second status of 10,000 jobs takes no longer in
one process than with the handing back of a second.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from jobgen.errors import JobgenError
from jobgen.record.damage import Verdicts, stamp
from jobgen.record.model import Run, RunJob

READERS_ENV = "JOBGEN_READERS"
THREAD = "jobgen-"  # the name of every thread jobgen starts begins so (see _may_fork)
JOBS_PER_READER = 2_500
MOST_READERS = 8

Work = Callable[[RunJob], object]
T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")


def readers_for(jobs: int) -> int:
    """How many processes read the records of this many jobs (weighed: see the module's docstring)."""
    value = os.environ.get(READERS_ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise JobgenError(
                f"{READERS_ENV}={value!r}: give how many processes read the jobs' records, a whole number"
                " from 1 (this process alone); or unset it"
            )
        return max(1, min(int(value), jobs))
    wanted = jobs // JOBS_PER_READER
    if wanted <= 1:
        return 1  # most runs: no core count or quota to look up
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpus()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, min(cores, MOST_READERS, wanted))


def cgroup_cpus(root: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> int | None:
    """The CPUs this process's control groups let it use, from their CPU quotas (rounded up; None: no
    quota, or none readable). A login node often caps each user at a few CPUs this way (a systemd
    CPUQuota, arbiter2) while the affinity mask still shows every core: readers beyond the quota only
    take turns. cgroup v2 (cpu.max) and v1 (cpu.cfs_quota_us), the process's own group and each above."""
    try:
        with open(own, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not controllers:
            folders, read = [root, os.path.join(root, "unified")], _v2_quota
        elif "cpu" in controllers.split(","):
            folders, read = [os.path.join(root, controllers), os.path.join(root, "cpu")], _v1_quota
        else:
            continue
        for folder in folders:
            here = "/" + path.strip("/")
            while True:
                limit = read(os.path.join(folder, here.lstrip("/")))
                if limit is not None:
                    limits.append(limit)
                if here == "/":
                    break
                here = os.path.dirname(here)
    return max(1, math.ceil(min(limits))) if limits else None


def _v2_quota(folder: str) -> float | None:
    """cpu.max: "max 100000" (none) or "<quota> <period>" in microseconds."""
    try:
        with open(os.path.join(folder, "cpu.max"), encoding="utf-8") as fh:
            quota, period = fh.read().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def _v1_quota(folder: str) -> float | None:
    """cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us."""
    try:
        with open(os.path.join(folder, "cpu.cfs_quota_us"), encoding="utf-8") as fh:
            quota = int(fh.read())
        with open(os.path.join(folder, "cpu.cfs_period_us"), encoding="utf-8") as fh:
            period = int(fh.read())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def share(runs: Sequence[Run], work: Work) -> Callable[[], None]:
    """Start reading every job of these runs with `work` (which reads the job's records and keeps facts
    of them in its run's verdicts); the function returned does this process's share and takes the
    others'. Forks, so call it before starting any thread."""
    jobs = [(r, j) for r, run in enumerate(runs) for j in range(len(run.jobs))]
    readers = _readers(len(jobs), lambda: _weight(runs))
    if readers <= 1:
        return lambda: _read(runs, jobs, work)

    def read(part: list[tuple[int, int]]) -> Any:
        for run in runs:
            if run.verdicts is not None:
                run.verdicts.track()
        _read(runs, part, work)
        seen = [runs[r].jobs[j].seen() for r, j in part]
        return seen, [run.verdicts.changed() if run.verdicts is not None else {} for run in runs]

    def hand_over(part: list[tuple[int, int]], handed: Any) -> bool:
        seen, kept = handed
        if len(seen) != len(part) or len(kept) != len(runs):
            return False
        for (r, j), job_seen in zip(part, seen, strict=True):
            runs[r].jobs[j].take_seen(job_seen)
        for run, facts in zip(runs, kept, strict=True):
            if run.verdicts is not None:
                run.verdicts.take(facts)
        return True

    return _start(shares(jobs, readers), read, lambda part: _read(runs, part, work), hand_over)


def gather(items: Sequence[T], read: Callable[[T], R]) -> list[R]:
    """[read(item) for item in items], the items shared among reader processes as `share` shares jobs:
    `read` reads files and returns what pickles (a reader that fails has its share read here). Forks,
    so call it while no other thread runs."""
    readers = _readers(len(items), lambda: len(items))
    if readers <= 1:
        return [read(item) for item in items]
    out: list[Any] = [None] * len(items)

    def own(part: list[int]) -> None:
        for i in part:
            out[i] = read(items[i])

    def hand_over(part: list[int], handed: Any) -> bool:
        if type(handed) is not list or len(handed) != len(part):
            return False
        for i, value in zip(part, handed, strict=True):
            out[i] = value
        return True

    _start(shares(range(len(items)), readers), lambda part: [read(items[i]) for i in part], own, hand_over)()
    return out


def _readers(items: int, weight: Callable[[], int]) -> int:
    """How many processes read these items now: one unless there are two or more and readers may be
    forked (_may_fork), else readers_for their weight."""
    return readers_for(weight()) if items > 1 and _may_fork() else 1


def _may_fork() -> bool:
    """Whether readers may be forked now: where there is fork, and not while one of jobgen's own threads
    runs (one asking Slurm, jobgen.results.state_rule.in_background: a fork copies no thread, and a lock one
    held stays held in the copy). Another program's threads (jobgen.api in a notebook's kernel) leave
    the reading to this process unless JOBGEN_READERS asks for readers."""
    if not hasattr(os, "fork"):
        return False
    alive = [t for t in threading.enumerate() if t.is_alive()]
    if any(t.name.startswith(THREAD) for t in alive):
        return False
    return len(alive) == 1 or bool(os.environ.get(READERS_ENV, "").strip())


def shares(jobs: Sequence[T], readers: int) -> list[list[T]]:
    """The jobs in `readers` contiguous shares (fewer when there are fewer jobs), none more than one job
    longer than another."""
    count = min(readers, len(jobs))
    if count < 1:
        return []
    size, longer = divmod(len(jobs), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (i < longer)
        out.append(list(jobs[start:end]))
        start = end
    return out


def _weight(runs: Sequence[Run]) -> int:
    """The jobs to read, one whose folder is as an earlier command saw it counting a quarter (it loads
    the runs' verdicts: every reader then starts from the same). Told from a sample of each run's job
    folders (SAMPLE stats): a sweep's jobs mostly changed or not together. A folder a command saw but
    that changed since (the job ran, or ended: its logs and result.json are new) costs a listing and
    reads: the first status after a sweep ended had its 10,000 jobs weighed as 2,500 from the folders
    an earlier status saw queued, and read them in one process."""
    weight = 0.0
    for run in runs:
        verdicts, jobs = run.verdicts, run.jobs
        if verdicts is None or not jobs:
            weight += 4 * len(jobs)
            continue
        verdicts.load()
        sample = jobs[:: max(1, len(jobs) // SAMPLE)]
        held = sum(1 for job in sample if _as_seen(job, verdicts))
        weight += len(jobs) * (held + 4 * (len(sample) - held)) / len(sample)
    return math.ceil(weight) // 4


SAMPLE = 64  # job folders stat'ed per run to weigh its reading (_weight)


def _as_seen(job: RunJob, verdicts: Verdicts) -> bool:
    """Whether the job's folder is as an earlier command saw it (its listing is kept for its stamp)."""
    try:
        mark = stamp(os.stat(job.folder))
    except OSError:
        return False
    return verdicts.facts(job.dir + "/", mark) is not None


def _read(runs: Sequence[Run], jobs: Sequence[tuple[int, int]], work: Work) -> None:
    for r, j in jobs:
        work(runs[r].jobs[j])


def _start(
    parts: list[list[P]],
    read: Callable[[list[P]], Any],
    own: Callable[[list[P]], object],
    hand_over: Callable[[list[P], Any], bool],
) -> Callable[[], None]:
    """Fork a reader for each part but the first (`read(part)` there gives what it hands back); the
    function returned does the first part here (`own`), then gives each reader's part what it handed
    back (`hand_over`: False when that is not what it should be), or does the part here instead."""
    started: list[tuple[int, int, list[P]]] = []
    try:
        for part in parts[1:]:
            started.append((*_fork(read, part), part))
    except OSError:  # no process to be had: this one reads what no reader took
        mine = [item for part in [parts[0], *parts[len(started) + 1 :]] for item in part]
        return lambda: _finish(mine, started, own, hand_over)
    return lambda: _finish(parts[0], started, own, hand_over)


def _fork(read: Callable[[list[P]], Any], part: list[P]) -> tuple[int, int]:
    """(pid, the pipe's read end) of a reader of `part`."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid:
        os.close(write_end)
        return pid, read_end
    # The reader: whatever happens, it leaves here, and only through os._exit.
    status = 1
    try:
        import pickle  # here and in _take: the CLI's start does without it

        os.close(read_end)
        data = memoryview(pickle.dumps(read(part), protocol=pickle.HIGHEST_PROTOCOL))
        while data:
            data = data[os.write(write_end, data) :]
        status = 0
    except BaseException:  # an interrupt too: the parent reads this share itself
        pass
    os._exit(status)


def _finish(
    mine: list[P],
    started: list[tuple[int, int, list[P]]],
    own: Callable[[list[P]], object],
    hand_over: Callable[[list[P], Any], bool],
) -> None:
    try:
        own(mine)
        while started:
            pid, read_end, part = started[0]
            handed = _take(read_end, pid)
            started.pop(0)
            try:
                taken = handed is not None and hand_over(part, handed)
            except (TypeError, ValueError):  # not what a reader hands back
                taken = False
            if not taken:
                own(part)
    finally:
        for pid, read_end, _ in started:  # interrupted: leave no reader behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _take(read_end, pid)


def _take(read_end: int, pid: int) -> Any:
    """What a reader handed back (None: nothing usable), once it has left."""
    chunks = []
    try:
        while chunk := os.read(read_end, 1 << 20):
            chunks.append(chunk)
    except OSError:
        chunks = []
    finally:
        os.close(read_end)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = 1
    if status != 0 or not chunks:
        return None
    try:
        import pickle

        return pickle.loads(b"".join(chunks))
    except Exception:
        return None
