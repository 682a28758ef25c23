"""`jobgen requeue` on the real cluster: failed jobs start again (same id and an appended log when Slurm
requeues them; a new id when Slurm refuses), completed ones stay, and a named running job is requeued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import (
    all_final,
    behave_experiment,
    jobgen,
    manifest,
    on_cluster,
    only_run,
    restarts,
    wait_states,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

POINTS = """
[[sweep.points]]
name = "steady"
"env.vars" = { BEHAVIOR = "ok" }

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


@pytest.fixture
def both_clusters(slurm_env: dict[str, str], slurm_no_accounting: dict[str, str]) -> dict[str, dict[str, str]]:
    """The clusters with and without accounting, each its client environment, by mode."""
    return {"accounting": slurm_env, "no-accounting": slurm_no_accounting}


def test_requeue_failed_then_running(both_clusters: dict[str, dict[str, str]], tmp_path: Path):
    """On both clusters at once (with accounting and without), each step on one, then on the other:
    the waits overlap."""
    runs: dict[str, tuple[Path, Path, dict[str, str]]] = {}
    for mode, env in both_clusters.items():
        with on_cluster(env):
            folder = tmp_path / mode
            folder.mkdir()
            root = folder / "runs"
            exp = behave_experiment(folder, "rqcmd", POINTS)
            jobgen("submit", str(exp), root=root)
            run_dir = only_run(root, "rqcmd")
            runs[mode] = (root, run_dir, {j["name"]: j["job_id"] for j in manifest(run_dir)["jobs"]})

    for mode, (root, run_dir, before) in runs.items():
        with on_cluster(both_clusters[mode]):
            _requeue_the_failed(root, run_dir, before)
    for mode, (root, run_dir, before) in runs.items():
        with on_cluster(both_clusters[mode]):
            _both_attempts_logged_then_requeue_the_running(root, run_dir, before)
    for mode, (root, run_dir, _) in runs.items():
        with on_cluster(both_clusters[mode]):
            wait_states(run_dir, lambda s: s["sleeper"] is State.CANCELLED, timeout=90)
            # `jobgen runs --refresh` asks Slurm again for what the manifest had last seen running.
            with_run = manifest(run_dir)
            with_run["jobs"][0]["state"] = State.RUNNING.value
            (run_dir / "manifest.json").write_text(json.dumps(with_run))
            listed = jobgen("runs", "rqcmd", "--refresh", root=root).stdout.splitlines()
            assert listed[1].split()[-5:] == ["4", "3", "COMPLETED,", "1", "CANCELLED"], (mode, listed)


def _requeue_the_failed(root: Path, run_dir: Path, before: dict[str, str]) -> None:
    wait_states(
        run_dir,
        lambda s: (
            s["steady"] is State.COMPLETED
            and s["flaky"] is State.FAILED
            and s["pinned"] is State.FAILED
            and s["sleeper"] is State.RUNNING
        ),
        timeout=120,
    )

    out = jobgen("requeue", str(run_dir), root=root).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(lines) == {"flaky", "pinned"}, out  # the completed and the running job are not picked
    assert "requeued: queued again under the same job id" in lines["flaky"]
    assert "resubmitted" in lines["pinned"] and "2 job(s) requeued" in out
    jobs = {j["name"]: j for j in manifest(run_dir)["jobs"]}
    assert jobs["flaky"]["job_id"] == before["flaky"] and jobs["flaky"]["requeues"] == 1
    # --no-requeue: Slurm refuses, so the script went in again under a new id; the old one is kept.
    assert jobs["pinned"]["job_id"] != before["pinned"] and jobs["pinned"]["previous_job_ids"] == [before["pinned"]]


def _both_attempts_logged_then_requeue_the_running(root: Path, run_dir: Path, before: dict[str, str]) -> None:
    states = wait_states(run_dir, lambda s: all_final({k: v for k, v in s.items() if k != "sleeper"}), timeout=180)
    assert (states["steady"], states["flaky"], states["pinned"]) == (State.COMPLETED,) * 3, states
    # One log across both attempts of the requeued job: its failure, then its success.
    err = jobgen("logs", str(run_dir), "flaky", "--err", root=root).stdout
    out = jobgen("logs", str(run_dir), "flaky", root=root).stdout
    assert "boom once" in err and out.count("[rank 0] rank 0 on n") == 2, (out, err)
    # The resubmitted job: found by its old id too, and its logs cover both ids' attempts.
    err = jobgen("logs", str(run_dir), before["pinned"], "--err", root=root).stdout
    out = jobgen("logs", str(run_dir), "pinned", root=root).stdout
    assert "boom once" in err and out.count("[rank 0] rank 0 on n") == 2, (out, err)

    assert "nothing to requeue" in jobgen("requeue", str(run_dir), root=root).stdout
    out = jobgen("requeue", str(run_dir), "steady", "sleeper", root=root).stdout
    assert "steady (COMPLETED" in out and "skipped" in out
    assert "sleeper (RUNNING" in out and "no checkpoint was asked for first" in out
    assert restarts(before["sleeper"]) == 1  # Slurm stopped it and queued it again, same id
    jobgen("cancel", str(run_dir), "sleeper", root=root)
