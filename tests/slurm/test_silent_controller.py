"""`jobgen status` while the controller does not answer: the real squeue, scontrol and sacct, pointed at
ports where nothing listens (a slurmctld and slurmdbd that are down), fail; a queued job whose folder
holds an earlier attempt's result.json keeps the state last recorded, with a warning, and nothing is
written to its record. Once Slurm answers again, its word counts."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.slurm.helpers import behave_experiment, jobgen, manifest, only_run

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

POINTS = """
[[sweep.points]]
name = "held"
"env.vars" = { BEHAVIOR = "finish" }
"slurm.extra" = { begin = "now+3600" }
"""


def _down(conf: Path, folder: Path) -> Path:
    """A copy of the cluster's slurm.conf whose controller and accounting ports have nobody listening,
    and whose clients give up after a second (MessageTimeout), as on a login node when slurmctld is down."""
    text = conf.read_text()
    text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=6997", text)
    text = re.sub(r"(?m)^AccountingStoragePort=.*$", "AccountingStoragePort=6998", text)
    down = folder / "down" / "slurm.conf"
    down.parent.mkdir()
    down.write_text(text + "MessageTimeout=2\nTCPTimeout=1\n")
    return down


def _state(status_out: str) -> str:
    header, row = status_out.splitlines()[1:3]
    return row[header.index("state") :].split()[0]


def test_a_silent_controller_changes_no_state(slurm, root: Path, tmp_path: Path):
    exp = behave_experiment(tmp_path, "silent", POINTS)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "silent")
    assert _state(jobgen("status", str(run_dir), root=root).stdout) == "PENDING"
    (job,) = manifest(run_dir)["jobs"]
    (run_dir / job["dir"] / "result.json").write_text(json.dumps({"schema": 1, "job": "held"}) + "\n")
    before = (run_dir / "manifest.json").read_bytes()
    try:
        down = {"SLURM_CONF": str(_down(Path(os.environ["SLURM_CONF"]), tmp_path))}
        said = jobgen("status", str(run_dir), root=root, env=down)
        assert _state(said.stdout) == "PENDING", said.stdout
        assert "Slurm did not answer (squeue failed: slurm_load_jobs error: Unable to contact slurm controller" in (
            said.stderr
        ), said.stderr
        assert "1 job shows the last state recorded, and none was changed" in said.stderr
        summary = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root, env=down).stdout)
        assert summary["rows"][0]["state"] == "PENDING"
        assert (run_dir / "manifest.json").read_bytes() == before
        # The controller answers again: the job is still queued, whatever its folder holds.
        said = jobgen("status", str(run_dir), root=root)
        assert _state(said.stdout) == "PENDING" and "did not answer" not in said.stderr
    finally:
        jobgen("cancel", str(run_dir), root=root, check=False)
