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
sys.path.insert(0, str(REPO))  # tests/ helpers import as `tests.x`

# One intra-op thread per process, for every process the tests start (ranks, local jobs, and the Slurm
# jobs, which inherit this environment through sbatch's default --export=ALL): the test machine has two
# cores shared by several ranks, and the test cluster's nodes claim 64 CPUs without binding tasks to any
# (TaskPlugin=task/none), so each rank would start as many spinning OpenMP threads as the machine has
# cores. Set before anything imports torch. A value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.conftest_slurm"] if (REPO / "tests" / "conftest_slurm.py").exists() else []

# Tests on the real cluster that spend their time waiting for Slurm (time limits, requeues after the
# credential lifetime, preemption's grace time, sacct, status --watch), not computing. Under pytest-xdist
# with --dist loadgroup (scripts/test.sh) they form one group, run one test after the other on worker
# gw0 with its own clusters; with 3 workers or more gw0 runs nothing else, so the others keep both cores
# busy with training meanwhile (measured: with the group on one of two workers, the run's first 13
# minutes had the CPU 45-60% busy). The other tests go one at a time to whichever worker is free. The
# groups are set here, by path, not with xdist_group marks: pytest-xdist 3.8 marks a group by rewriting
# item._nodeid, which pytest 9 no longer reads, so its marks group nothing.
WAITING_ON_SLURM = (
    "tests/test_cluster.py",
    "tests/slurm/test_states.py",
    "tests/slurm/test_chain.py",
    "tests/slurm/test_requeue_command.py",
    "tests/slurm/test_preemption.py",
    "tests/slurm/test_requeue.py",
    "tests/slurm/test_retries.py",
    # Not waiting, but timed (the probe's predictions against the jobs' real wall time): the group's
    # last test, with the machine to itself (ALONE below).
    "tests/slurm/test_probe.py",
)
WAITING = "waiting-on-slurm"
# Short Slurm tests that mostly wait too, handed to the other workers last, after the fast tests: worker
# 0's chain is the run's longest (measured: the others ended 100 s before it), and these 127 s of it
# (concurrent submits and requeues, the controller's restart, lost replies, arrays, cost's sacct)
# fill the others' end instead, on their own clusters.
LAST = (
    "tests/slurm/test_concurrency.py",
    "tests/slurm/test_at_most_once.py",
    "tests/slurm/test_controller.py",
    "tests/slurm/test_arrays.py",
    "tests/slurm/test_cost.py",
)
# Modules whose tests share a module-scoped fixture (one training run): one worker, so it runs once.
ONE_WORKER_MODULES = ("tests/training/test_hf_trainer_fsdp.py", "tests/training/test_local_demo.py")


# Where the long tests are: they are handed out first, so that the run does not end with one worker on
# a long test while the other has nothing left.
HEAVY = ("tests/slurm/", "tests/training/", "tests/test_prefetch.py", "tests/test_cluster.py")


def _heavy_first(scope: str) -> int:
    if scope.startswith(LAST):
        return 2
    return 0 if scope.startswith(HEAVY) or scope == WAITING else 1


def xdist_group(nodeid: str) -> str:
    """The unit of work pytest-xdist hands to one worker: a group name, or the test's own id."""
    path = nodeid.split("::", 1)[0]
    if path in WAITING_ON_SLURM:
        return WAITING
    if path in ONE_WORKER_MODULES:
        return path
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadgroup with the groups above (xdist's own loadgroup, for any xdist_group marks, first);
    with 3 workers or more, gw0 runs the waiting group and nothing else."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    workers = config.getoption("numprocesses", None)
    dedicated = isinstance(workers, int) and workers >= 3

    class Scheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope: str = super()._split_scope(nodeid)
            return xdist_group(nodeid) if scope == nodeid else scope

        def _assign_work_unit(self, node: Any) -> None:
            waiter = dedicated and node.gateway.id == "gw0"
            units = [s for s in self.workqueue if not dedicated or (s == WAITING) == waiter]
            # The long tests first, the short ones last, to fill the gaps at the end.
            scope = min(units, key=_heavy_first, default=None)
            if scope is None:  # nothing of this worker's kind is left: it ends once its tests have run
                if not node.shutting_down:
                    node.shutdown()
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            super()._reschedule(node)

    return Scheduling(config, log)


# The probe test (tests/slurm/test_probe.py) compares the wall time it predicts with the full jobs' own,
# so it runs with the machine to itself: it is the last test of the waiting group (worker 0's chain of
# tests is the longest, so the other workers have usually ended by then: measured, with the probe
# first they ended 150 s before worker 0), it waits for the tests the other workers are running to
# end, and no other test starts until it has ended. Its two jobs keep both cores busy meanwhile. Two
# flocks in /tmp/jobgen-test-turns-<xdist's run id>/, shared by the workers (a lock dies with its
# process: a crashed worker blocks nobody): the probe holds `gate` exclusively for the whole test and
# takes `run` exclusively once the others' tests have let go of it; every other test passes `gate`
# (shared, at once released) and then holds `run` shared while it runs.
ALONE = ("tests/slurm/test_probe.py",)


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
