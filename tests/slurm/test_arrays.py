"""A sweep as job arrays on the real cluster: split at MaxArraySize (11 here), throttled, tracked per task."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import all_final, behave_sweep, jobgen, manifest, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def test_sweep_as_arrays(slurm, root: Path, tmp_path: Path):
    exp = behave_sweep(tmp_path, "arr", 12)
    out = jobgen("submit", str(exp), "--array", "--array-parallelism", "4", root=root).stdout
    assert "array-0: submitted as array" in out and "(11 tasks)" in out and "(1 tasks)" in out
    run_dir = only_run(root, "arr")
    doc = manifest(run_dir)
    assert [len(a["tasks"]) for a in doc["arrays"]] == [11, 1]
    array_id = doc["arrays"][0]["job_id"]
    assert doc["jobs"][3]["job_id"] == f"{array_id}_3"
    states = wait_states(run_dir, all_final, timeout=240)
    assert set(states.values()) == {State.COMPLETED}, states
    follow = jobgen("logs", str(run_dir), "seed-4", "--follow", root=root, timeout=60).stdout
    assert "[rank 0] rank 0 on n" in follow
    table = jobgen("status", str(run_dir), root=root).stdout
    assert table.count("COMPLETED") == 12 and f"{array_id}_10" in table
