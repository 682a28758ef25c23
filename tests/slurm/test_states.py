"""Jobs made to end each way show the right state in `jobgen status`, with and without accounting."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import behave_experiment, jobgen, manifest, on_cluster, only_run, wait_states

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

POINTS = """
[[sweep.points]]
name = "ok"
"env.vars" = { BEHAVIOR = "ok" }

[[sweep.points]]
name = "fail"
"env.vars" = { BEHAVIOR = "fail" }

[[sweep.points]]
name = "cancelme"
"env.vars" = { BEHAVIOR = "sleep" }

[[sweep.points]]
name = "timeout"
"env.vars" = { BEHAVIOR = "sleep" }
"slurm.time" = "1"

[[sweep.points]]
name = "later"
"env.vars" = { BEHAVIOR = "ok" }
"slurm.extra" = { begin = "now+3600" }

[[sweep.points]]
name = "running"
"env.vars" = { BEHAVIOR = "sleep" }
"""


@pytest.fixture
def both_clusters(slurm_env: dict[str, str], slurm_no_accounting: dict[str, str]) -> dict[str, dict[str, str]]:
    """The clusters with and without accounting, each its client environment, by mode."""
    return {"accounting": slurm_env, "no-accounting": slurm_no_accounting}


def test_every_state_shows(both_clusters: dict[str, dict[str, str]], tmp_path: Path):
    """On both clusters at once (status reads sacct with accounting, squeue and scontrol without): the
    time limit's wait, the test's longest, is then waited for once."""
    runs: dict[str, tuple[Path, Path]] = {}
    for mode, env in both_clusters.items():
        with on_cluster(env):
            assert (Path(env["JOBGEN_CLUSTER_DIR"]) / "mode").read_text().strip() == mode
            folder = tmp_path / mode
            folder.mkdir()
            root = folder / "runs"
            exp = behave_experiment(folder, "states", POINTS)
            jobgen("submit", str(exp), root=root)
            run_dir = only_run(root, "states")
            assert all(j["job_id"] for j in manifest(run_dir)["jobs"])
            runs[mode] = (root, run_dir)

    for mode, (root, run_dir) in runs.items():
        with on_cluster(both_clusters[mode]):
            wait_states(
                run_dir,
                lambda s: (
                    s["ok"] is State.COMPLETED
                    and s["fail"] is State.FAILED
                    and s["running"] is State.RUNNING
                    and s["cancelme"] is State.RUNNING
                    and s["later"] is State.PENDING
                    and s["timeout"] in (State.RUNNING, State.TIMEOUT)
                ),
                timeout=90,
            )
            out = jobgen("cancel", str(run_dir), "cancelme", root=root).stdout
            assert "cancel sent" in out, mode
            # The time limit's end brought to now: Slurm ends the job as TIMEOUT at its next check of the
            # limits (every 30 s), not 60-90 s after its start; the 1-minute limit stays the backstop.
            (timeout_job,) = [j["job_id"] for j in manifest(run_dir)["jobs"] if j["name"] == "timeout"]
            subprocess.run(["scontrol", "update", f"JobId={timeout_job}", "EndTime=now"], capture_output=True)

    for mode, (root, run_dir) in runs.items():
        with on_cluster(both_clusters[mode]):
            states = wait_states(
                run_dir, lambda s: s["cancelme"] is State.CANCELLED and s["timeout"] is State.TIMEOUT, timeout=240
            )
            assert states["later"] is State.PENDING and states["running"] is State.RUNNING, (mode, states)

            table = jobgen("status", str(run_dir), root=root).stdout
            for name, state in [
                ("ok", "COMPLETED"),
                ("fail", "FAILED"),
                ("cancelme", "CANCELLED"),
                ("timeout", "TIMEOUT"),
                ("later", "PENDING"),
                ("running", "RUNNING"),
            ]:
                line = next(line for line in table.splitlines() if line.startswith(name + " "))
                assert state in line, (mode, table)
            fail_line = next(line for line in table.splitlines() if line.startswith("fail "))
            assert "3:0" in fail_line, (mode, table)  # the exit code the job gave
            jobgen("cancel", str(run_dir), root=root)

    for mode, (root, run_dir) in runs.items():
        with on_cluster(both_clusters[mode]):
            wait_states(
                run_dir, lambda s: s["later"] is State.CANCELLED and s["running"] is State.CANCELLED, timeout=60
            )
            watch = jobgen("status", str(run_dir), "--watch", "--interval", "1", "--timeout", "30", root=root)
            assert watch.returncode == 0, mode

            errors = jobgen("logs", str(run_dir), "fail", "--err", root=root).stdout
            assert "[rank 0] boom" in errors, mode
            out = jobgen("logs", str(run_dir), "ok", root=root).stdout
            assert "[rank 0] rank 0 on n" in out, mode


def test_sacct_fails_without_accounting(slurm_any):
    done = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True)
    mode = (Path(slurm_any["JOBGEN_CLUSTER_DIR"]) / "mode").read_text().strip()
    assert (done.returncode == 0) == (mode == "accounting"), (mode, done.stderr)
