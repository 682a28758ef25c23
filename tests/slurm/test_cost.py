"""What jobs cost, on the real cluster: GPU- and CPU-hours from sacct where the cluster keeps accounting
(every attempt of a requeued job), from the request where it does not; no energy where it records none."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from jobgen.states import State, from_slurm
from tests.slurm.helpers import all_final, behave_experiment, jobgen, manifest, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

LIMIT_MIN = 10
# Jobs that work a few seconds: one holding two of a node's (fake) GPUs, one CPU job of 3 CPUs.
POINTS = f"""
[[sweep.points]]
name = "gpus"
"env.vars" = {{ BEHAVIOR = "ok", NAP = "4" }}
"slurm.gpus_per_node" = 2
"slurm.time" = "{LIMIT_MIN}"
"train.devices" = 2
"train.accelerator" = "gpu"

[[sweep.points]]
name = "cpus"
"env.vars" = {{ BEHAVIOR = "ok", NAP = "4" }}
"slurm.cpus_per_task" = 3
"slurm.time" = "{LIMIT_MIN}"
"""
REQUEST = {"gpus": (2, 2), "cpus": (0, 3)}  # job -> (GPUs, CPUs) asked: 2 tasks × 1 CPU; 1 task × 3 CPUs


def _sacct_attempts(job_id: str) -> list[dict[str, str]]:
    """Every attempt sacct -D lists for a job, read here without jobgen's parser."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-D", "--format=JobID,State,ElapsedRaw,AllocTRES,ConsumedEnergyRaw", "-j", job_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    keys = ("id", "state", "elapsed", "tres", "energy")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line]


def _count(tres: str, name: str) -> int:
    found = re.search(rf"(?:^|,){re.escape(name)}=(\d+)", tres)
    return int(found.group(1)) if found else 0


def _wait_accounted(job_id: str, attempts: int, timeout: float = 60) -> list[dict[str, str]]:
    """The accounting database is written after the controller: wait until it holds the ended attempts."""
    deadline = time.monotonic() + timeout
    while True:
        found = _sacct_attempts(job_id)
        states = [from_slurm(a["state"]) for a in found]  # an attempt Slurm requeued is REQUEUED
        if len(found) >= attempts and all(s.is_final or s is State.REQUEUED for s in states):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"sacct did not record {attempts} ended attempt(s) of {job_id}: {found}")
        time.sleep(1)


def _summary(run_dir: Path, root: Path) -> dict:
    return json.loads(jobgen("summary", str(run_dir), "--format", "json", "--no-combine", root=root).stdout)


def test_hours_come_from_sacct_with_accounting(slurm, root: Path, tmp_path: Path) -> None:
    jobgen("submit", str(behave_experiment(tmp_path, "cost", POINTS)), root=root)
    run_dir = only_run(root, "cost")
    wait_states(run_dir, all_final, timeout=120)
    ids = {j["name"]: j["job_id"] for j in manifest(run_dir)["jobs"]}
    attempts = {name: _wait_accounted(job_id, 1) for name, job_id in ids.items()}
    doc = _summary(run_dir, root)
    rows = {r["config"]: r for r in doc["rows"]}
    for name, found in attempts.items():
        (one,) = found
        row = rows[name]
        assert row["state"] == "COMPLETED", row
        # The test cluster's accounting does not track GPUs (no gres/gpu in AccountingStorageTRES), as
        # many do not: AllocTRES lists none, and the GPUs asked (--gpus-per-node) are what was held.
        gpus = _count(one["tres"], "gres/gpu") if "gres/gpu" in one["tres"] else REQUEST[name][0]
        cpus = _count(one["tres"], "cpu")
        assert gpus == REQUEST[name][0] and cpus >= REQUEST[name][1], one
        elapsed = int(one["elapsed"])
        assert elapsed >= 4, one  # it napped 4 s
        assert row["gpu_hours"] == pytest.approx(gpus * elapsed / 3600, abs=1e-6)
        assert row["cpu_hours"] == pytest.approx(cpus * elapsed / 3600, abs=1e-6)
        assert row["time_used_fraction"] == pytest.approx(elapsed / (LIMIT_MIN * 60), abs=1e-6)
        # The test cluster has no energy plugin: sacct says 0 or nothing, and the summary says unknown.
        assert one["energy"] in ("", "0") and row["energy_kwh"] is None
    assert doc["totals"]["gpu_hours"] == pytest.approx(
        sum(r["gpu_hours"] for r in rows.values()), abs=1e-5
    )  # each rounded
    assert doc["totals"]["energy_kwh"] is None


def test_hours_come_from_the_request_without_accounting(slurm_no_accounting, monkeypatch, root: Path, tmp_path: Path):
    for key in ("SLURM_CONF", "JOBGEN_CLUSTER_DIR"):
        monkeypatch.setenv(key, slurm_no_accounting[key])
    jobgen("submit", str(behave_experiment(tmp_path, "cost", POINTS)), root=root)
    run_dir = only_run(root, "cost")
    wait_states(run_dir, all_final, timeout=120)  # jobgen's status records each job's start and end
    doc = _summary(run_dir, root)
    rows = {r["config"]: r for r in doc["rows"]}
    for job in manifest(run_dir)["jobs"]:
        row = rows[job["name"]]
        # scontrol still holds the ended job (MinJobAge): its run time, read here, is what was used.
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job["job_id"]], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        start, end = (
            datetime.fromisoformat(re.search(rf"{k}=(\S+)", shown).group(1)) for k in ("StartTime", "EndTime")
        )
        elapsed = (end - start).total_seconds()
        assert elapsed >= 4, shown
        gpus, cpus = REQUEST[job["name"]]
        assert row["gpu_hours"] == pytest.approx(gpus * elapsed / 3600, abs=1e-6), row
        assert row["cpu_hours"] == pytest.approx(cpus * elapsed / 3600, abs=1e-6), row
        assert row["time_used_fraction"] == pytest.approx(elapsed / (LIMIT_MIN * 60), abs=1e-6)
        assert row["energy_kwh"] is None  # no accounting: no energy either
    assert doc["totals"]["cpu_hours"] == pytest.approx(
        sum(r["cpu_hours"] for r in rows.values()), abs=1e-5
    )  # each rounded
    assert doc["totals"]["energy_kwh"] is None


def _batch_steps(job_id: str) -> list[int]:
    """The ElapsedRaw of each attempt's batch step, in order (sacct -D, steps included)."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-D", "--format=JobID,ElapsedRaw", "-j", job_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [int(line.split("|")[1]) for line in out.splitlines() if line.split("|")[0] == f"{job_id}.batch"]


def test_every_attempt_of_a_requeued_job_is_counted(slurm, root: Path, tmp_path: Path) -> None:
    """A job that failed, then was requeued (same id) and completed: sacct -D lists both, and both are
    paid for, each until its batch step ended: Slurm records the failed attempt as held until the
    requeue, 5 s and more after it ended. (Without accounting the first attempt is recorded nowhere:
    tests/core/test_cost.py.)"""
    points = '[[sweep.points]]\nname = "flaky"\n"env.vars" = { BEHAVIOR = "fail-once", NAP = "3" }\n'
    jobgen("submit", str(behave_experiment(tmp_path, "again", points)), root=root)
    run_dir = only_run(root, "again")
    wait_states(run_dir, lambda s: s["flaky"] is State.FAILED, timeout=90)
    time.sleep(5)  # the node is free meanwhile: not paid for
    jobgen("requeue", str(run_dir), root=root)
    wait_states(run_dir, lambda s: s["flaky"] is State.COMPLETED, timeout=180)
    (job,) = manifest(run_dir)["jobs"]
    found = _wait_accounted(job["job_id"], 2)
    assert len(found) == 2 and found[0]["state"] == "REQUEUED", found
    steps = _batch_steps(job["job_id"])
    assert len(steps) == 2 and int(found[0]["elapsed"]) >= steps[0] + 5, (found, steps)
    held = [steps[0], int(found[1]["elapsed"])]
    elapsed = sum(held)
    cpus = {_count(a["tres"], "cpu") for a in found}
    assert len(cpus) == 1 and elapsed >= 6, found
    (row,) = _summary(run_dir, root)["rows"]
    assert row["cpu_hours"] == pytest.approx(cpus.pop() * elapsed / 3600, abs=1e-6)
    assert row["gpu_hours"] == 0
    # Both attempts are final in the accounting: the manifest keeps them, and the next summary asks
    # sacct nothing for the job (a sacct that fails on PATH would leave only the request to go by).
    kept = manifest(run_dir)["jobs"][0]["usage"]
    assert [a[1] for a in kept["attempts"][job["job_id"]]] == held
    shim = tmp_path / "no-sacct"
    shim.mkdir()
    (shim / "sacct").write_text("#!/bin/sh\nexit 1\n")
    (shim / "sacct").chmod(0o755)
    again = json.loads(
        jobgen(
            "summary",
            str(run_dir),
            "--format",
            "json",
            "--no-combine",
            root=root,
            env={"PATH": f"{shim}:{os.environ['PATH']}"},
        ).stdout
    )
    assert again["rows"][0]["cpu_hours"] == row["cpu_hours"] and again["rows"][0]["usage_from"] == "sacct"
