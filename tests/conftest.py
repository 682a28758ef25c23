"""Test isolation: no test touches the user's real state, Slurm variables or the network."""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
_CPU_AT_START = pytest.StashKey[tuple[float, float]]()
sys.path.insert(0, str(REPO))  # tests/ helpers import as `tests.x`

# One intra-op thread per process, for every process the tests start (ranks, local jobs, and the Slurm
# jobs, which inherit this environment through sbatch's default --export=ALL): the test machine has two
# cores shared by several ranks, and the test cluster's nodes claim 64 CPUs without binding tasks to any
# (TaskPlugin=task/none), so each rank would start as many spinning OpenMP threads as the machine has
# cores. Set before anything imports torch. A value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tools the dev install brings (shellcheck, ruff) are found beside this interpreter, activated or not.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

pytest_plugins = ["tests.support.conftest_slurm"] if (REPO / "tests" / "support" / "conftest_slurm.py").exists() else []

# Tests on the real cluster that spend their time waiting for Slurm (time limits, requeues after the
# credential lifetime, preemption's grace time, sacct, status --watch, the controller's restart), not
# computing, longest first (seconds of a clean run on 2026-12-04). Under pytest-xdist with --dist
# loadgroup (scripts/test.sh), each test is a unit of its own and the units go out by kind
# (pick_unit): the waiters (waiter_ids: gw0 with 3 workers, gw0 and gw1 with 4) take the waiting
# tests, longest first, while the others keep both cores busy with the training tests, longest first;
# a worker that has run out of its own kind takes the other kind's shortest left (not a waiter of
# two: four training tests at once on two cores go no faster and fail timing checks). So whichever kind
# takes longer on the machine of the day (the waiting chain on a fast one, the training on a slow one:
# CI's machine varies 2x), the workers end about together. The groups are set here, by path, not with
# xdist_group marks: pytest-xdist 3.8 marks a group by rewriting item._nodeid, which pytest 9 no longer
# reads, so its marks group nothing.
WAITING_ON_SLURM = (
    "tests/slurm/test_queue_limits.py",  # 230: a cluster of its own, sweeps waiting for room in the queue
    "tests/slurm/test_chain.py",  # 130: a 1-minute limit, three segments
    "tests/slurm/test_states.py",  # 2 x 87: every state, with and without accounting
    "tests/slurm/test_requeue.py",  # 80 + 43
    "tests/slurm/test_preemption.py",  # 72 + 49 + 35: GraceTime
    "tests/slurm/test_cluster.py",  # 40 + 14 + ...: time limit's signal, requeue
    "tests/slurm/test_retries.py",  # 31 + 31
    "tests/slurm/test_requeue_command.py",  # 19 + 16
    "tests/slurm/test_concurrency.py",  # 33
    "tests/slurm/test_cost.py",  # 25 + 7 + 6
    "tests/slurm/test_controller.py",  # 18: the controller's restart
    "tests/slurm/test_at_most_once.py",  # 9 + 7 + 2: lost replies
    "tests/slurm/test_arrays.py",  # 2
)
# Modules whose tests share a module-scoped fixture (one training run): one worker, so it runs once.
ONE_WORKER_MODULES = (
    "tests/training/test_hf_trainer_fsdp.py",
    "tests/training/test_local_demo.py",
    "tests/slurm/test_queue_limits.py",  # a cluster of its own, started once for the module
)
# The test that runs with the machine to itself (see below): handed out last, when no other is left.
ALONE = ("tests/slurm/test_probe.py",)


# Where the long tests are: they are handed out first, so that the run does not end with one worker on
# a long test while the other has nothing left.
HEAVY = ("tests/slurm/", "tests/training/", "tests/training/test_prefetch.py")


def xdist_group(nodeid: str) -> str:
    """The unit of work pytest-xdist hands to one worker: a module whose tests share a fixture, or the
    test's own id."""
    path = nodeid.split("::", 1)[0]
    return path if path in ONE_WORKER_MODULES else nodeid


def _waiting_rank(unit: str) -> int | None:
    """The unit's place in WAITING_ON_SLURM (longest first); None for a test that does not wait."""
    path = unit.split("::", 1)[0]
    return WAITING_ON_SLURM.index(path) if path in WAITING_ON_SLURM else None


def waiter_ids(workers: int) -> frozenset[str]:
    """The workers that take the waiting tests first: none below 3 workers, gw0 with 3, gw0 and gw1
    with 4 or more (splitting the waiting chain, for a machine where CPU is not what binds the run)."""
    return frozenset(f"gw{i}" for i in range(min(max(workers - 2, 0), 2)))


def pick_unit(units: list[str], waiter: bool, own_only: bool = False) -> str | None:
    """The next unit for a worker, from the units left in collection order: `waiter` (see waiter_ids)
    takes the longest waiting test left, the others the longest training test left (HEAVY first); a
    worker with none of its kind left takes the other kind's shortest, except a waiter with
    `own_only`, which takes none (None): two waiters that trained too would run four training tests
    at once on two cores, no faster, and slow enough that timing checks fail. The ALONE test goes out
    only when nothing else is left."""
    rest = [u for u in units if not u.startswith(ALONE)]
    if not rest:
        return units[0] if units else None
    waiting = sorted((u for u in rest if _waiting_rank(u) is not None), key=lambda u: _waiting_rank(u) or 0)
    training = sorted((u for u in rest if _waiting_rank(u) is None), key=lambda u: not u.startswith(HEAVY))
    own, other = (waiting, training) if waiter else (training, waiting)
    if own:
        return own[0]
    return None if waiter and own_only else other[-1]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadgroup with the units above (xdist's own loadgroup, for any xdist_group marks, first),
    handed out by pick_unit."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    workers = config.getoption("numprocesses", None)
    waiters = waiter_ids(workers if isinstance(workers, int) else 0)

    class Scheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope: str = super()._split_scope(nodeid)
            return xdist_group(nodeid) if scope == nodeid else scope

        def _assign_work_unit(self, node: Any) -> None:
            scope = pick_unit(list(self.workqueue), node.gateway.id in waiters, own_only=len(waiters) > 1)
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            super()._reschedule(node)

    return Scheduling(config, log)


# The probe test (tests/slurm/test_probe.py) compares the wall time it predicts with the full jobs' own,
# so it runs with the machine to itself: it is the last unit handed out (pick_unit: the other workers
# have then no test left to start, only their current ones to finish), it waits for the tests the other
# workers are running to end, and no other test starts until it has ended. Its two jobs keep both
# cores busy meanwhile. Two flocks in /tmp/jobgen-test-turns-<xdist's run id>/, shared by the workers
# (a lock dies with its process: a crashed worker blocks nobody): the probe holds `gate` exclusively
# for the whole test and takes `run` exclusively once the others' tests have let go of it; every other
# test passes `gate` (shared, at once released) and then holds `run` shared while it runs.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.startswith(ALONE))  # stable: only the probe test moves, to the end


def _lock(path: Path, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, mode)
    return fd


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Around the whole test, outside pytest-timeout's clock: a test's wait for its turn is no hang."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run_id:
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"jobgen-test-turns-{run_id}"
    folder.mkdir(exist_ok=True)
    alone = item.nodeid.startswith(ALONE)
    gate = _lock(folder / "gate", fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    if not alone:
        os.close(gate)
    held = _lock(folder / "run", fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(held)
        if alone:
            os.close(gate)


def _cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, from /proc/stat (Linux only)."""
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / tick, sum(ticks) / tick


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput") and os.path.exists("/proc/stat"):
        session.config.stash[_CPU_AT_START] = _cpu_seconds()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """How busy the machine's CPUs were during the run: whether the suite's time is computing (near
    100%: fewer or cheaper training processes help) or waiting (more waiters help)."""
    start = config.stash.get(_CPU_AT_START, None)
    if start is None:
        return
    busy, total = (now - then for now, then in zip(_cpu_seconds(), start, strict=True))
    if total > 0:
        terminalreporter.write_line(
            f"CPU: {busy:.0f} of {total:.0f} core-seconds busy ({100 * busy / total:.0f}%) during the tests, on {os.cpu_count()} cores, this machine's every process counted"
        )


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Clear SLURM_* (unless a test runs inside a real job), point caches and homes at tmp_path."""
    if "slurm" not in request.keywords:
        for name in list(os.environ):
            if name.startswith(("SLURM_", "SBATCH_", "SRUN_")):
                monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("JOBGEN_OUTPUT_ROOT", raising=False)
    monkeypatch.delenv("JOBGEN_DEBUG", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    # No user's sites file (and no scontrol asked for the cluster's name because of one).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("JOBGEN_SITE", raising=False)
    monkeypatch.delenv("JOBGEN_SITES_FILE", raising=False)


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    return root
