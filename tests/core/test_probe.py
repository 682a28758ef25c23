"""The probe's prediction model, the limits `slurm.time = "auto"` / `slurm.mem = "auto"` choose, and their
refusals, in-process (no training, no cluster: the probe's measurements are written by hand, Slurm's
`scontrol show partition` is a stand-in). The real probe and full jobs: tests/slurm/test_probe.py."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from jobgen.backends._slurm import partition_max_time
from jobgen.cli import main
from jobgen.commands import limits, submit
from jobgen.commands.probe import Point, failures, table
from jobgen.errors import ConfigError, SubmitError
from jobgen.record.lookup import find_runs, latest_real
from jobgen.results.predict import mem_limit_mb, predict, slurm_time, time_limit_minutes
from tests.core.conftest import stub_tool

# What training/probe.py writes for a job of 3 epochs x 100 batches per epoch (1 rank), 1000 validation
# and 500 test rows; the probe ran 5 warm-up + 30 batches and scored 64 + 64 rows.
MEASURED = {
    "schema": 1,
    "batches": 35,
    "warmup_batches": 5,
    "timed_batches": 30,
    "samples_per_s": 40.0,
    "warmup_wall_s": 4.0,
    "batch_wall_s": 0.5,
    "data_prep_s": 6.0,
    "eval_s": 1.28,
    "eval_rows": 128,
    "epoch_end_s": 2.0,
    "setup_s": 3.0,
    "engine_s": 22.3,  # 4 + 30 x 0.5 + 1.28 + 2.0, from the first batch to the engine's end
    "process_s": 33.0,
    "world_size": 1,
    "full": {
        "epochs": 3,
        "max_steps": 0,
        "grad_accum": 1,
        "samples": {"train": 1600, "validation": 1000, "test": 500},
        "batches_per_epoch": 100,
        "eval_rows": 128,
        "data_from_cache": False,
    },
    "peak_memory_mb": {"host_rss": 900.0, "gpu_max_allocated": None},
}


def test_the_full_job_is_start_up_plus_prep_train_eval_and_checkpoints():
    p = predict("j", MEASURED, elapsed_s=40, ranks_per_node=1)
    startup = 40 - (6.0 + 22.3)  # the probe's elapsed less what it measured: launch, imports, set-up, exit
    train = 4.0 + (300 - 5) * 0.5  # warm-up as measured, then every other batch at the steady pace
    evaluation = 1.28 / 128 * (3 * 1000 + 500)  # validation each epoch, test once
    checkpoints = 3 * 2.0
    assert p.startup_s == pytest.approx(startup)
    assert p.train_s == pytest.approx(train)
    assert p.eval_s == pytest.approx(evaluation)
    assert p.checkpoints_s == pytest.approx(checkpoints)
    assert p.predicted_wall_s == pytest.approx(startup + 6.0 + train + evaluation + checkpoints)
    assert p.predicted_peak_mem_mb == 900.0 and p.elapsed_from == "scheduler"
    assert p.eval_s_per_sample == pytest.approx(0.01) and p.samples_per_s == 40.0


def test_max_steps_cuts_the_full_job_and_ranks_add_memory():
    m = json.loads(json.dumps(MEASURED))
    m["full"]["max_steps"] = 120  # 1.2 epochs: two epochs run, the second cut short
    p = predict("j", m, elapsed_s=None, ranks_per_node=4)
    assert p.train_s == pytest.approx(4.0 + (120 - 5) * 0.5)
    assert p.epochs == 2 and p.checkpoints_s == pytest.approx(4.0)
    assert p.eval_s == pytest.approx(0.01 * (2 * 1000 + 500))
    assert p.startup_s == pytest.approx(33.0 - 28.3) and p.elapsed_from == "process"
    assert p.predicted_peak_mem_mb == 3600.0


@pytest.mark.parametrize(
    ("predicted", "margin", "max_s", "minutes"),
    [
        (30, 1.3, None, 1),  # 39 s: one minute, the least Slurm keeps
        (46, 1.3, None, 1),  # 59.8 s
        (47, 1.3, None, 2),  # 61.1 s: rounded up, never down
        (3600, 1.0, None, 60),
        (3600, 1.5, 4000, 66),  # 90 min asked, MaxTime 66 min 40 s: the partition's whole minutes
        (50, 1.3, 60, 1),  # 65 s asked, MaxTime 1 minute
    ],
)
def test_time_limits_are_whole_minutes_rounded_up_within_max_time(predicted, margin, max_s, minutes):
    assert time_limit_minutes(predicted, margin, max_s) == minutes


def test_a_job_longer_than_max_time_cannot_fit():
    with pytest.raises(ValueError, match="longer than the partition's MaxTime"):
        time_limit_minutes(7300, 1.3, 7200)


def test_limits_in_slurms_words():
    assert slurm_time(1) == "00:01:00" and slurm_time(61) == "01:01:00" and slurm_time(24 * 60 + 5) == "1-00:05:00"
    assert mem_limit_mb(900.0, 1.3) == math.ceil(1170.0) and mem_limit_mb(100.2, 1.0) == 101


SCONTROL = (
    "PartitionName=debug AllowGroups=ALL Default=YES MaxTime=UNLIMITED State=UP\n"
    "PartitionName=gpu AllowGroups=ALL MaxTime=7-00:00:00 State=UP\n"
    "PartitionName=short MaxTime=00:10:00 State=UP\n"
)


def test_max_time_is_read_from_scontrol_show_partition():
    assert partition_max_time(SCONTROL, "") is None  # the default partition, unlimited
    assert partition_max_time(SCONTROL, "gpu") == 7 * 86400
    assert partition_max_time(SCONTROL, "short") == 600
    with pytest.raises(SubmitError, match="slurm.partition: Slurm has no partition 'nope'"):
        partition_max_time(SCONTROL, "nope")


# --- auto limits, end to end through submit's own path ------------------------------------------------


def _experiment(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "auto.toml"
    path.write_text(
        '[experiment]\nname = "auto"\n[slurm]\ntime = "auto"\nmem = "auto"\ncpus_per_task = 1\n' + extra + "\n"
        '[train]\nmodel = "builtin:tiny"\nepochs = 1\n[data]\ndataset = "builtin:synthetic"\n'
        '[sweep.grid]\n"train.lr" = [0.001, 0.002]\n'
    )
    return path


def _probe_run(tmp_path: Path, exp: Path, walls: dict[str, float], *, fingerprint: str | None = None) -> Path:
    """A probe run as `jobgen probe` leaves it, its predictions written by hand."""
    prepared = submit.prepare(exp, tmp_path / "runs", probe={"steps": 30})
    code = submit.training_package_dir()
    points = [
        {
            "name": job.name,
            "point": limits.point_key(job),
            "predicted_wall_s": walls[job.name],
            "predicted_peak_mem_mb": 1000.0,
        }
        for job in prepared.jobs
    ]
    doc = {"schema": 1, "code_fingerprint": fingerprint or limits.code_fingerprint(code), "points": points}
    (prepared.run_dir / limits.PREDICTIONS).write_text(json.dumps(doc))
    return prepared.run_dir


@pytest.fixture
def partitions(bin_dir: Path) -> Path:
    stub_tool(bin_dir, "scontrol", f"printf '{SCONTROL}'\n")
    return bin_dir


def test_auto_takes_the_newest_probe_times_the_margin(tmp_path: Path, partitions: Path, monkeypatch):
    from jobgen.record import store

    ids = iter(["20261201-100000-ffff", "20261201-100001-0000", "20261201-100002-aaaa"])
    monkeypatch.setattr(store, "new_run_id", lambda output_root=None: next(ids))  # runs a second apart (ids order them)
    exp = _experiment(tmp_path, "time_margin = 1.5\nmem_margin = 1.2")
    _probe_run(tmp_path, exp, {"lr-0.001": 1000.0, "lr-0.002": 1000.0})
    newest = _probe_run(tmp_path, exp, {"lr-0.001": 100.0, "lr-0.002": 200.0})
    prepared = submit.prepare(exp, tmp_path / "runs", dry_run=True)
    scripts = {job["name"]: (prepared.run_dir / job["script"]).read_text() for job in prepared.manifest["jobs"]}
    assert "#SBATCH --time=00:03:00" in scripts["lr-0.001"]  # 150 s -> 3 minutes
    assert "#SBATCH --time=00:05:00" in scripts["lr-0.002"]  # 300 s -> 5 minutes
    assert all("#SBATCH --mem=1200M" in s for s in scripts.values())
    assert any(newest.name in note and "slurm.time_margin 1.5" in note for note in prepared.notes)
    spec = json.loads((prepared.run_dir / "jobs" / "lr-0.001" / "spec.json").read_text())
    assert spec["slurm"]["time"] == "00:03:00" and "probe" not in spec


def test_the_probe_runs_auto_limits_as_the_partitions_defaults(tmp_path: Path):
    prepared = submit.prepare(_experiment(tmp_path), tmp_path / "runs", probe={"steps": 7})
    script = (prepared.run_dir / "jobs" / "lr-0.001" / "job.sbatch").read_text()
    assert "--time" not in script and "--mem" not in script
    assert prepared.manifest["kind"] == "probe"
    assert json.loads((prepared.run_dir / "jobs" / "lr-0.001" / "spec.json").read_text())["probe"] == {"steps": 7}


def test_a_job_that_cannot_fit_the_partition_is_refused_with_the_chain_hint(tmp_path: Path, partitions: Path):
    exp = _experiment(tmp_path, 'partition = "short"')
    _probe_run(tmp_path, exp, {"lr-0.001": 100.0, "lr-0.002": 700.0})
    with pytest.raises(ConfigError, match=r"lr-0.002: predicted 11m40s is longer .* slurm.chain"):
        submit.prepare(exp, tmp_path / "runs", dry_run=True)


def test_a_time_just_under_max_time_is_capped_at_it(tmp_path: Path, partitions: Path):
    exp = _experiment(tmp_path, 'partition = "short"')
    _probe_run(tmp_path, exp, {"lr-0.001": 500.0, "lr-0.002": 590.0})  # x 1.3 would be 11 and 13 minutes
    prepared = submit.prepare(exp, tmp_path / "runs", dry_run=True)
    assert all(
        "#SBATCH --time=00:10:00" in (prepared.run_dir / j["script"]).read_text() for j in prepared.manifest["jobs"]
    )


def _refusal(runner, tmp_path: Path, exp: Path, *sets: str) -> str:
    args = ["--output-root", str(tmp_path / "runs"), "submit", str(exp), "--dry-run"]
    result = runner.invoke(main, [*args, *[f"--set={s}" for s in sets]])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_auto_without_a_probe_is_refused(runner, tmp_path: Path):
    line = _refusal(runner, tmp_path, _experiment(tmp_path))
    assert 'slurm.time = "auto"' in line and "run `jobgen probe" in line and "first" in line


def test_a_probe_of_other_points_does_not_count(runner, tmp_path: Path):
    exp = _experiment(tmp_path)
    _probe_run(tmp_path, exp, {"lr-0.001": 100.0, "lr-0.002": 100.0})
    line = _refusal(runner, tmp_path, exp, "train.epochs=2")  # the same names, other jobs
    assert "no probe of these 2 point(s)" in line and "first" in line


def test_a_probe_older_than_the_training_code_is_refused(runner, tmp_path: Path):
    exp = _experiment(tmp_path)
    _probe_run(tmp_path, exp, {"lr-0.001": 100.0, "lr-0.002": 100.0}, fingerprint="0" * 64)
    line = _refusal(runner, tmp_path, exp)
    assert "ran other training code" in line and "again" in line


def test_an_edit_of_the_training_code_changes_the_fingerprint(tmp_path: Path):
    code = tmp_path / "training"
    code.mkdir()
    (code / "a.py").write_text("x = 1\n")
    before = limits.code_fingerprint(code)
    (code / "a.py").write_text("x = 2\n")
    assert limits.code_fingerprint(code) != before


@pytest.mark.parametrize("key", ["slurm.time_margin", "slurm.mem_margin"])
def test_a_margin_below_one_is_refused_naming_the_key(runner, tmp_path: Path, key: str):
    line = _refusal(runner, tmp_path, _experiment(tmp_path), f"{key}=0.9")
    assert key in line and "at least 1" in line


def test_the_margin_is_in_the_schema_with_its_bounds(runner):
    result = runner.invoke(main, ["schema"])
    assert re.search(r"slurm\.time_margin\s+float\s+= 1\.3\s+\(at least 1\.0 and at most 100\.0\)", result.output)
    assert "auto = the newest probe" in result.output


def test_a_probe_run_is_listed_but_never_the_latest_run(runner, tmp_path: Path):
    exp = _experiment(tmp_path, "")
    root = tmp_path / "runs"
    real = submit.prepare(exp, root, sets=["slurm.time=00:10:00", "slurm.mem=1G"]).run_dir
    probe = submit.prepare(exp, root, probe={"steps": 3}).run_dir
    assert find_runs(["auto"], root) == [real.resolve()] and latest_real([real, probe]) == real
    assert find_runs([str(probe)], root) == [probe.resolve()]  # named by its folder, it is read
    listed = runner.invoke(main, ["--output-root", str(root), "runs", "auto"])
    assert probe.name in listed.output and "(probe)" in listed.output


def test_probe_output_names_each_point_and_a_failure_its_cause():
    ok = Point("a", "COMPLETED", predict("a", MEASURED, 40, 1))
    bad = Point("b", "OUT_OF_MEMORY", None, "Killed", "raise slurm.mem")
    header, rows = table([ok, bad])
    assert rows[0][0] == "a" and rows[0][header.index("predicted mem (MB)")] == "900"
    assert failures([ok, bad]) == ["b: OUT_OF_MEMORY: Killed (raise slurm.mem)"]
    doc = bad.as_json()
    assert doc["predicted_wall_s"] is None and doc["cause"] == "Killed"
    assert {"name", "predicted_wall_s", "predicted_peak_mem_mb"} <= set(ok.as_json())


def test_a_probe_whose_points_all_fail_is_one_line(runner, tmp_path: Path):
    exp = _experiment(tmp_path, "")
    text = exp.read_text().replace("[train]", '[env]\npython = "/bin/false"\n[launch]\nbackend = "local"\n[train]')
    exp.write_text(text)
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "probe", str(exp), "--interval", "0.1"])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: probe of 2 point(s): every one failed; first: lr-0.001: FAILED")


# --- the training side's arithmetic (training/probe.py), without torch -------------------------------------


def test_the_probe_budget_is_warm_up_plus_steps_and_the_full_job_is_remembered(tmp_path: Path):
    from training import probe as probing
    from training.spec import from_dict

    raw = {"job_dir": str(tmp_path), "train": {"model": "builtin:tiny", "max_steps": 500, "epochs": 2}}
    spec = probing.budget(from_dict({**raw, "probe": {"steps": 30, "warmup_steps": 5}}))
    assert spec.train.max_steps == 35 and probing.RECORDER is not None
    again = probing.budget(spec)  # the spec a launcher hands its ranks: still the full job's max_steps
    assert again.train.max_steps == 35 and probing.RECORDER.full["max_steps"] == 500
    assert probing.budget(from_dict(raw)).train.max_steps == 500  # no probe section: the job as it is
    assert probing.RECORDER is None


def test_the_probe_measures_warm_up_steady_batches_and_the_epoch_end():
    from types import SimpleNamespace

    from training.probe import Recorder, measurements

    rec = Recorder(warmup=2, full={"eval_rows": 10})
    # Windows open at 10, 12, 13, 14, 15 and last 1.5, 0.5, 0.5, 0.5, 0.5 s; bookkeeping 0.5 s between.
    rec.opened, rec.seconds, rec.rows = [10.0, 12.0, 13.0, 14.0, 15.0], [1.5, 0.5, 0.5, 0.5, 0.5], [8] * 5
    rec.closed = [o + s for o, s in zip(rec.opened, rec.seconds, strict=True)]
    rec.engine_done = 15.5 + 3.0
    stats = SimpleNamespace(times_s={"eval": 1.0, "data_prep": 2.0}, world_size=2, scored={"test": 6})
    m = measurements(rec, stats)
    assert m["warmup_wall_s"] == pytest.approx(12.5 - 10.0)
    assert m["batch_wall_s"] == pytest.approx((15.5 - 12.5) / 3)
    assert m["samples_per_s"] == pytest.approx(3 * 8 * 2 / 1.5)  # the steady windows only, all ranks
    assert m["epoch_end_s"] == pytest.approx(3.0 - 1.0) and m["engine_s"] == pytest.approx(8.5)
    assert m["eval_rows"] == 6


def test_a_failed_point_shows_the_cause_and_hint_from_its_log(tmp_path: Path):
    from jobgen.commands.probe import point_of
    from jobgen.results.state_rule import read_runs
    from tests.data.summary.synth import FakeJob, write_run

    oom = (Path(__file__).parents[1] / "data" / "summary" / "logs" / "oom_kill.out").read_text()
    run_dir = write_run(tmp_path, "exp", [FakeJob("j", state="OUT_OF_MEMORY", result=None, logs={"slurm-1.out": oom})])
    (run,) = read_runs([run_dir], live=False)
    planned = submit.prepare(_experiment(tmp_path), tmp_path / "runs", probe={"steps": 1}).jobs[0]
    point = point_of(run.jobs[0], planned, "sbatch")
    assert point.prediction is None and point.state == "OUT_OF_MEMORY"
    assert "out of memory" in point.cause.lower() and "raise slurm.mem" in point.hint


def test_a_rerun_with_set_keeps_the_limits_auto_chose_then(tmp_path: Path):
    from jobgen.commands.rerun import _as_limited

    job = submit.prepare(_experiment(tmp_path), tmp_path / "runs", probe={"steps": 1}).jobs[0]
    auto = dataclasses.replace(
        job, exp=dataclasses.replace(job.exp, slurm=dataclasses.replace(job.exp.slurm, time="auto", mem="auto"))
    )
    again = _as_limited(auto, {"slurm": {"time": "00:07:00", "mem": "900M"}})
    assert (again.exp.slurm.time, again.exp.slurm.mem) == ("00:07:00", "900M")
    assert _as_limited(job, {"slurm": {"time": "00:07:00"}}) is job  # a limit given by hand stays
