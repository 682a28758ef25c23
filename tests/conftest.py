"""Test isolation: no test touches the user's real state, Slurm variables or the network."""

from __future__ import annotations

import fcntl
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
_CPU_AT_START = pytest.StashKey[tuple[float, float]]()
_TEST_CPU_AT_START = pytest.StashKey[tuple[float, float, float]]()
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
# computing, longest first (seconds of full runs on 2026-12-06, or alone where a test changed since). Under pytest-xdist with --dist
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
    "tests/slurm/test_queue_limits.py",  # 212 alone: a cluster of its own, sweeps waiting for room in the queue
    "tests/slurm/test_halving.py::test_a_chain_pauses_holds_its_segments_and_a_promotion_resumes_it",  # 240: 1-minute segments
    "tests/slurm/test_requeue.py",  # 108 + 59 + 58
    "tests/slurm/test_preemption.py",  # 94 + 70: GraceTime
    "tests/slurm/test_chain.py",  # 41 + 3: a time limit brought to now, three segments
    "tests/slurm/test_concurrency.py",  # 37
    "tests/slurm/test_retries.py",  # 34 + 34
    "tests/slurm/test_cluster.py",  # 33 + 14 + ...: time limit's signal, requeue
    "tests/slurm/test_states.py",  # 29: every state, both clusters at once, a time limit brought to now
    "tests/slurm/test_requeue_command.py",  # 28: both clusters at once
    "tests/slurm/test_cost.py",  # 26 + 7 + 7
    "tests/slurm/test_controller.py",  # 20: the controller's restart
    "tests/slurm/test_at_most_once.py",  # 8 + 5 + 3: lost replies
    "tests/slurm/test_arrays.py",  # 7
)
# Modules whose tests share a module-scoped fixture (one training run): one worker, so it runs once.
ONE_WORKER_MODULES = (
    "tests/training/test_hf_trainer_fsdp.py",
    "tests/training/test_local_demo.py",
    "tests/core/test_json_output.py",  # a real local probe run (11 s), for two of its tests
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
    """The unit's place in WAITING_ON_SLURM (longest first; a module or one test); None for a test that
    does not wait."""
    for key in (unit, unit.split("::", 1)[0]):
        if key in WAITING_ON_SLURM:
            return WAITING_ON_SLURM.index(key)
    return None


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
    _write_cpu_account(terminalreporter)
    start = config.stash.get(_CPU_AT_START, None)
    if start is None:
        return
    busy, total = (now - then for now, then in zip(_cpu_seconds(), start, strict=True))
    if total > 0:
        terminalreporter.write_line(
            f"CPU: {busy:.0f} of {total:.0f} core-seconds busy ({100 * busy / total:.0f}%) during the tests, on {os.cpu_count()} cores, this machine's every process counted"
        )


# JOBGEN_TEST_CPU=1: each test's CPU seconds (the test's process, and the children it waited for, with
# theirs: ranks, local jobs, jobgen commands) and wall seconds, and the run's summary lists the modules
# by CPU. Unlike the machine's busy share above, a test's CPU does not grow with other people's load on
# the machine. Jobs run by Slurm (under slurmd) are not counted: a Slurm test's training is not in it.
_ACCOUNT_CPU = os.environ.get("JOBGEN_TEST_CPU") == "1"


def _own_cpu() -> tuple[float, float, float]:
    """(this process', its waited-for children's, wall) seconds."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, time.monotonic()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if _ACCOUNT_CPU:
        item.stash[_TEST_CPU_AT_START] = _own_cpu()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    start = item.stash.get(_TEST_CPU_AT_START, None)
    if call.when == "teardown" and start is not None:
        own, kids, wall = (now - then for now, then in zip(_own_cpu(), start, strict=True))
        outcome.get_result().user_properties.append(("cpu_s", [round(own, 2), round(kids, 2), round(wall, 2)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller (with xdist, the workers' reports come here): collect the accounts."""
    for key, value in report.user_properties:
        if key == "cpu_s":
            own, kids, wall = value
            _PER_TEST_CPU.append((report.nodeid, float(own), float(kids), float(wall)))


_PER_TEST_CPU: list[tuple[str, float, float, float]] = []  # (test, own, children's, wall seconds)


def _write_cpu_account(terminalreporter: Any) -> None:
    rows = _PER_TEST_CPU
    if not rows:
        return
    by_module: dict[str, list[float]] = {}
    for nodeid, own, kids, wall in rows:
        totals = by_module.setdefault(nodeid.split("::", 1)[0], [0.0, 0.0, 0.0])
        totals[0] += own + kids
        totals[1] += wall
        totals[2] += 1
    cpu = sum(own + kids for _, own, kids, _ in rows)
    terminalreporter.write_sep("-", "CPU of the tests (JOBGEN_TEST_CPU=1; Slurm's jobs not counted)")
    for module, (seconds, wall, count) in sorted(by_module.items(), key=lambda kv: -kv[1][0])[:25]:
        terminalreporter.write_line(f"{seconds:8.1f} s CPU {wall:8.1f} s wall {int(count):4d} tests  {module}")
    terminalreporter.write_line(f"{cpu:8.1f} s CPU in all, {len(rows)} tests")
    for nodeid, own, kids, wall in sorted(rows, key=lambda r: -(r[1] + r[2]))[:25]:
        terminalreporter.write_line(f"{own + kids:8.1f} s CPU ({kids:7.1f} children) {wall:8.1f} s wall  {nodeid}")


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
