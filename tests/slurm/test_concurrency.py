"""Concurrent use with real processes on the real cluster: two submits of one experiment at the same instant
get two runs; two requeues of one run at once start each job once; `status --watch` beside them never
reads a half-written manifest."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import (
    JOBGEN,
    all_final,
    behave_experiment,
    behave_sweep,
    manifest,
    only_run,
    restarts,
    wait_states,
)
from tests.slurm.test_at_most_once import tagged

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def _start(*args: str, root: Path) -> subprocess.Popen:
    env = {**os.environ, "JOBGEN_OUTPUT_ROOT": str(root)}
    return subprocess.Popen([JOBGEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _together(*commands: tuple[str, ...], root: Path) -> list[tuple[int, str, str]]:
    """Start the commands at the same instant (a barrier, then Popen each); their (rc, stdout, stderr)."""
    barrier = threading.Barrier(len(commands))
    procs: list[subprocess.Popen] = [None] * len(commands)  # type: ignore[list-item]

    def go(i: int) -> None:
        barrier.wait()
        procs[i] = _start(*commands[i], root=root)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(commands))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(p.wait(timeout=120), *p.communicate()) for p in procs]


def test_two_submits_at_once_get_two_runs(slurm, root: Path, tmp_path: Path):
    exp = behave_sweep(tmp_path, "twice", seeds=2)
    results = _together(("submit", str(exp)), ("submit", str(exp)), root=root)
    assert [rc for rc, _, _ in results] == [0, 0], results
    runs = sorted(p for p in (root / "twice").iterdir())
    assert len(runs) == 2 and runs[0].name != runs[1].name, runs
    assert not [p for p in (root / "twice").iterdir() if p.name.startswith(".")]
    for run_dir in runs:
        names = [j["name"] for j in manifest(run_dir)["jobs"]]
        assert tagged(run_dir) == Counter(names), f"{run_dir.name}: each job queued once"
        wait_states(run_dir, all_final, timeout=120)


POINTS = """
[[sweep.points]]
name = "flaky"
"env.vars" = { BEHAVIOR = "fail-once" }

[[sweep.points]]
name = "pinned"
"env.vars" = { BEHAVIOR = "fail-once" }
"slurm.extra" = { no-requeue = true }

[[sweep.points]]
name = "sleeper"
"env.vars" = { BEHAVIOR = "sleep" }
"""


def test_two_requeues_at_once_start_each_job_once_while_status_watches(slurm, root: Path, tmp_path: Path):
    exp = behave_experiment(tmp_path, "rqtwice", POINTS)
    _start("submit", str(exp), root=root).wait(timeout=60)
    run_dir = only_run(root, "rqtwice")
    first = {j["name"]: j["job_id"] for j in manifest(run_dir)["jobs"]}
    wait_states(
        run_dir, lambda s: s["flaky"] is s["pinned"] is State.FAILED and s["sleeper"] is State.RUNNING, timeout=90
    )

    # Beside the requeues: `status --watch` (the sleeper keeps it watching until its timeout), and a reader
    # that parses the manifest as fast as it can.
    watch = _start("status", str(run_dir), "--watch", "--interval", "0.2", "--timeout", "30", root=root)
    reads, bad, stop = [0], [], threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads((run_dir / "manifest.json").read_text())
                reads[0] += 1
            except (ValueError, OSError) as exc:
                bad.append(repr(exc))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        results = _together(("requeue", str(run_dir)), ("requeue", str(run_dir)), root=root)
        assert [rc for rc, _, _ in results] == [0, 0], results
        outs = [out for _, out, _ in results]
        # One of them requeued both jobs; the other, after it, found nothing left to requeue.
        assert sorted("2 job(s) requeued" in o for o in outs) == [False, True], outs
        jobs = {j["name"]: j for j in manifest(run_dir)["jobs"]}
        assert jobs["flaky"]["job_id"] == first["flaky"] and jobs["flaky"]["requeues"] == 1
        assert jobs["pinned"]["previous_job_ids"] == [first["pinned"]] and jobs["pinned"]["requeues"] == 1
        states = wait_states(run_dir, lambda s: s["flaky"].is_final and s["pinned"].is_final, timeout=120)
        assert states["flaky"] is states["pinned"] is State.COMPLETED, states
        assert restarts(first["flaky"]) == 1, "flaky was requeued twice"
        assert tagged(run_dir) == Counter({"flaky": 1, "pinned": 2, "sleeper": 1}), "pinned went in more than twice"
        out, err = watch.communicate(timeout=150)  # reads as it goes: the pipe never fills
        rc = watch.returncode
        # It refreshed all along and stopped only at its own timeout, never on a manifest it could not read.
        assert (
            rc == 1
            and err.strip() == f"Error: jobs still running after 30 s; check again with: jobgen status {run_dir}"
        ), err
        assert out.count("run: ") >= 10 and "warning" not in out, out[-2000:]
    finally:
        stop.set()
        reader.join()
        if watch.poll() is None:
            watch.kill()
        subprocess.run(
            [JOBGEN, "cancel", str(run_dir), "sleeper"],
            env={**os.environ, "JOBGEN_OUTPUT_ROOT": str(root)},
            capture_output=True,
            timeout=60,
        )
    assert reads[0] > 50 and not bad, (reads, bad[:3])
