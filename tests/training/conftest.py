"""Shared fixtures: offline hub, no inherited Slurm state, one cache for the whole session.

The tiny model and the tokenized synthetic data are built once per session (cache_dir keyed by the
data fingerprint), so each test pays only for its own training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# Bytecode: scripts/bootstrap.sh installs the venv with --compile-bytecode, so every process reads
# torch's, transformers' and lightning's compiled modules from the venv. (A PYTHONPYCACHEPREFIX of our
# own would hide those: measured, the first process under an empty one spends 31 s of CPU importing
# what takes 10 s from the venv's bytecode, and each pytest worker and first rank pays it.) These
# machines set PYTHONDONTWRITEBYTECODE; a module without bytecode is compiled once and kept.
sys.dont_write_bytecode = False
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

# Small and quick: ~60 steps per epoch; the synthetic signal is learnt within the first epoch.
TINY_TRAIN = {
    "engine": "torch",
    "model": "builtin:tiny",
    "epochs": 2,
    "batch_size": 32,
    "eval_batch_size": 128,
    "lr": 3e-3,
    "num_workers": 0,
    "accelerator": "cpu",
    "log_every_n_steps": 10,
    "seed": 7,
    "warmup_compile_steps": 0,  # every batch timed: tests count timed samples exactly
}
TINY_DATA = {"dataset": "builtin:synthetic", "partition": [1600, 300, 400], "max_length": 64}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key, raising=False)
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def one_thread() -> Any:
    """In-process runs of the tiny model use one intra-op thread: its ops are too small to gain from
    two, and on a shared 2-core box two spinning threads slow them down many times over."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("training-cache")


def spec_dict(
    job_dir: Path, cache_dir: Path, train: dict | None = None, data: dict | None = None, requeue: dict | None = None
) -> dict[str, Any]:
    return {
        "schema": 1,
        "experiment": "test",
        "job": job_dir.name,
        "job_dir": str(job_dir),
        "cache_dir": str(cache_dir),
        "train": {**TINY_TRAIN, **(train or {})},
        "data": {**TINY_DATA, **(data or {})},
        "requeue": requeue or {},
    }


def write_spec(job_dir: Path, cache_dir: Path, **parts: Any) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / "spec.json"
    path.write_text(json.dumps(spec_dict(job_dir, cache_dir, **parts)))
    return path


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for entrypoint subprocesses: offline, no inherited Slurm, bytecode written where missing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # DeepSpeed JIT-builds its CPU comm extension (~40 s); a directory of our own keeps the build
    # between tests and runs (a shared ~/.cache one gets rebuilt whenever another user's flags differ):
    # the one scripts/test.sh exports (under ~/.cache/jobgen-test, kept between sessions, where a fresh
    # clone's .pytest_cache is empty), else one in .pytest_cache.
    # One thread per process: two ranks on two cores must not oversubscribe them.
    # PYTHONFAULTHANDLER: a hung entrypoint shows every thread's stack (`dump_stacks`) before it is killed.
    env.update(
        OFFLINE,
        PYTHONPATH=str(REPO),
        PYTHONFAULTHANDLER="1",
        OMP_NUM_THREADS="1",
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR") or str(REPO / ".pytest_cache" / "torch-extensions"),
        **(extra or {}),
    )
    return env


# Entrypoints this test started. When the test fails or times out (run_entrypoint's timeout or
# pytest-timeout), `_no_rank_outlives_its_test` kills each one with every process under it, so no
# orphaned rank goes on training (on a 2-core machine it slows every test after it). The tree is walked
# first: torchrun, which the entrypoint runs for several local devices, starts each rank in a session
# of its own, so a signal to the entrypoint's process group would miss them.
_STARTED: list[subprocess.Popen] = []


def _kill_tree(proc: subprocess.Popen) -> None:
    import signal

    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    # A rank killed while it JIT-builds DeepSpeed's extension leaves torch's build lock behind (a file
    # named "lock" in the build folder, where ninja runs), and every later build waits on it for ever.
    builds = set()
    for member in tree:
        try:
            if member.name() == "ninja":
                builds.add(Path(member.cwd()))
        except psutil.Error:
            pass
    for member in tree:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what of its own group outlived a parent that had ended
    except (ProcessLookupError, PermissionError):
        pass
    psutil.wait_procs(tree, timeout=10)
    proc.wait()
    for build in builds:
        (build / "lock").unlink(missing_ok=True)


def dump_stacks(proc: subprocess.Popen, log: Path) -> str:
    """Where a hung entrypoint's processes (the ranks and their DataLoader workers) wait: SIGABRT makes
    faulthandler (PYTHONFAULTHANDLER, set by `subprocess_env`) write each one's threads to the log."""
    import signal

    import psutil

    size = log.stat().st_size if log.exists() else 0
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return ""
    for member in tree:
        try:
            if "python" in member.name():
                member.send_signal(signal.SIGABRT)
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=5)
    if not log.exists():
        return ""
    with open(log, "rb") as handle:
        handle.seek(size)
        return "stacks of the hung processes:\n" + handle.read().decode("utf-8", errors="replace")[-12000:]


@pytest.fixture(autouse=True)
def _no_rank_outlives_its_test() -> Any:
    yield
    while _STARTED:
        _kill_tree(_STARTED.pop())


def start(spec: Path, env: dict[str, str], log: Path, lines: list[tuple[float, str]] | None = None) -> subprocess.Popen:
    """Start `python -m training --spec` with its output in `log`. With `lines`, each output line is
    also appended there with the monotonic time it arrived (the first entry: the start), for tests of
    how often the job speaks; its output then goes through a pipe that a thread of this process reads."""
    if lines is None:
        handle = open(log, "w")  # noqa: SIM115 - closed by the process' end (kept for the test's diagnostics)
        proc = subprocess.Popen(
            [sys.executable, "-m", "training", "--spec", str(spec)],
            cwd=REPO,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _STARTED.append(proc)
        return proc
    lines.append((time.monotonic(), "<start>"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "training", "--spec", str(spec)],
        cwd=REPO,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _STARTED.append(proc)

    def pump() -> None:
        assert proc.stdout is not None
        with open(log, "wb") as handle:
            for raw in proc.stdout:
                lines.append((time.monotonic(), raw.decode("utf-8", errors="replace").rstrip("\n")))
                handle.write(raw)
                handle.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    _READERS[proc.pid] = reader
    return proc


_READERS: dict[int, threading.Thread] = {}


def wait(proc: subprocess.Popen, timeout: float) -> int:
    """The process' exit status, once its output (when a `lines` reader has it) is all read."""
    rc = proc.wait(timeout=timeout)
    reader = _READERS.pop(proc.pid, None)
    if reader is not None:
        reader.join(timeout=30)
    return rc


def run_entrypoint(
    spec: Path, env: dict[str, str], timeout: float, lines: list[tuple[float, str]] | None = None
) -> dict[str, Any]:
    """Run `python -m training --spec` to the end; return result.json (the log is shown on failure).
    `lines`: as for `start`."""
    log = spec.parent / "entrypoint.log"
    proc = start(spec, env, log, lines)
    try:
        rc = wait(proc, timeout)
    except subprocess.TimeoutExpired:
        said = log.read_text()[-4000:]
        stacks = dump_stacks(proc, log)
        _kill_tree(proc)  # with the ranks it started
        raise AssertionError(f"entrypoint timed out; log:\n{said}\n{stacks}") from None
    assert rc == 0, f"rc={rc}; log:\n{log.read_text()[-6000:]}"
    return json.loads((spec.parent / "result.json").read_text())


def run_here(spec: Path) -> dict[str, Any]:
    """Run a one-rank job in the test's own process (the libraries are imported once for every such
    test of a worker, where `run_entrypoint` pays torch's, transformers' and Lightning's import each
    time); return its result.json. For what the process itself does (signals, exit codes, ranks), use
    `run_entrypoint`."""
    from training.run import run
    from training.spec import load

    assert run(load(spec), spec) == 0
    return json.loads((spec.parent / "result.json").read_text())
