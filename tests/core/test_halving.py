"""Successive halving: the pure rule against a brute-force reference, the decision files under real
races (threads and processes on a real file system), and [sweep.halving]'s validation."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen.errors import ConfigError
from jobgen.experiment import config
from jobgen.experiment import halving as halving_config
from jobgen.results import halving as halving_view
from jobgen.states import State
from tests.core.conftest import stub_tool
from training import halving

METRICS = st.sampled_from([0.1, 0.25, 0.5, 0.5, 0.75, 0.9, math.nan])


def brute_promotable(reports: dict[str, float], promoted: set[str], eta: int, mode: str) -> list[str]:
    """The rule written out the long way: a job's rank is the number of jobs strictly ahead of it."""

    def ahead(a: str, b: str) -> bool:  # a ranks before b
        va, vb = reports[a], reports[b]
        if math.isnan(va) != math.isnan(vb):
            return math.isnan(vb)
        if not math.isnan(va) and va != vb:
            return va > vb if mode == "max" else va < vb
        return a < b

    k = len(reports) // eta
    rank = {j: sum(ahead(o, j) for o in reports if o != j) for j in reports}
    top = [j for j in reports if rank[j] < k]
    free = k - len([j for j in promoted if j in reports])
    candidates = sorted((j for j in top if j not in promoted), key=lambda j: rank[j])
    return candidates[: max(free, 0)]


@given(
    st.dictionaries(st.from_regex(r"[a-e][0-9]", fullmatch=True), METRICS, max_size=12),
    st.data(),
    st.integers(2, 5),
    st.sampled_from(["max", "min"]),
)
def test_rule_matches_brute_force(reports: dict[str, float], data: st.DataObject, eta: int, mode: str) -> None:
    promoted = set(data.draw(st.lists(st.sampled_from(sorted(reports)), unique=True))) if reports else set()
    got = halving.promotable(reports, promoted, eta, mode)
    assert got == brute_promotable(reports, promoted, eta, mode)
    assert len(got) + len(promoted & set(reports)) <= max(len(reports) // eta, len(promoted & set(reports)))


def test_rule_by_hand() -> None:
    # 9 reports, eta 3: the top 3 go on; with one promoted early (and since pushed out), two more.
    reports = {f"j{i}": v for i, v in enumerate([0.1, 0.9, 0.5, 0.7, 0.2, 0.8, 0.3, 0.4, 0.6])}
    assert halving.promotable(reports, set(), 3, "max") == ["j1", "j5", "j3"]
    assert halving.promotable(reports, {"j8"}, 3, "max") == ["j1", "j5"]
    assert halving.promotable(reports, set(), 3, "min") == ["j0", "j4", "j6"]
    assert halving.promotable(dict(list(reports.items())[:2]), set(), 3, "max") == []


def _report_and_settle(base: str, rung: int, job: str, metric: float, eta: int) -> None:
    found = halving.Settings(rungs=(rung,), eta=eta, metric="val_acc", mode="max")
    halving.report(Path(base), rung, job, metric)
    halving.settle(Path(base), rung, found)


def _check_board(base: Path, rung: int, jobs: dict[str, float], eta: int) -> None:
    reports = halving.read_reports(base, rung)
    assert {j: r["metric"] for j, r in reports.items()} == jobs  # no report lost, none changed
    done = halving.promoted(base, rung)
    assert len(done) <= len(jobs) // eta  # never past the rule, whatever the interleaving
    slots = sorted(p.name for p in (base / "slots" / str(rung)).iterdir()) if done else []
    assert len(slots) == len(done)  # every decision holds one slot, and no slot is left without one
    for job in done:  # each decision follows the rule on the reports its maker read
        made = halving.decision(base, rung, job)
        assert made is not None
        k = len(made["seen"]) // eta
        assert job in halving.ranked({j: jobs[j] for j in made["seen"]}, "max")[:k] and made["slot"] < k
    # After everyone settled once more (a `jobgen status`), the top jobs fill what the rule allows.
    found = halving.Settings(rungs=(rung,), eta=eta, metric="val_acc", mode="max")
    halving.settle(base, rung, found)
    done = halving.promoted(base, rung)
    assert len(done) == len(jobs) // eta


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(0, 1), min_size=2, max_size=10), st.integers(2, 4))
def test_racing_threads_never_promote_past_the_rule(
    tmp_path_factory: pytest.TempPathFactory, values: list[float], eta: int
) -> None:
    base = tmp_path_factory.mktemp("board")
    jobs = {f"job{i}": v for i, v in enumerate(values)}
    start = threading.Barrier(len(jobs))

    def one(job: str) -> None:
        start.wait()
        _report_and_settle(str(base), 1, job, jobs[job], eta)
        _report_and_settle(str(base), 1, job, jobs[job], eta)  # a requeued job reports again: a no-op

    threads = [threading.Thread(target=one, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _check_board(base, 1, jobs, eta)


def _process(base: str, job: str, metric: float, eta: int, start: object) -> None:
    start.wait()  # type: ignore[attr-defined]
    _report_and_settle(base, 3, job, metric, eta)


def test_racing_processes_never_promote_past_the_rule(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for attempt in range(8):
        base = tmp_path / str(attempt)
        jobs = {f"p{i}": round((i * 7 % 12) / 12, 3) for i in range(12)}
        start = ctx.Barrier(len(jobs))
        procs = [ctx.Process(target=_process, args=(str(base), j, v, 3, start)) for j, v in jobs.items()]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(30)
            assert proc.exitcode == 0
        _check_board(base, 3, jobs, 3)


def test_a_cancelled_run_promotes_nobody_until_it_is_resumed(tmp_path: Path) -> None:
    """`jobgen cancel` marks the run: a job at its rung still reports and pauses, and promotes nobody
    (a job it promoted would be requeued by it); once resumed (`jobgen requeue`), the rule applies."""
    base, found = tmp_path / "halving", halving.Settings((1,), 2, "accuracy", "max")
    assert not halving.at_rung(base, found, "a", 1, 0.9, tmp_path / "ca")
    halving.cancel(base)
    assert halving.cancelled(base)
    assert not halving.at_rung(base, found, "b", 1, 0.1, tmp_path / "cb")  # settled, a would be promoted
    assert set(halving.read_reports(base, 1)) == {"a", "b"} and not halving.promoted(base, 1)
    halving.resume(base)
    assert not halving.cancelled(base) and halving.settle(base, 1, found) == ["a"]


def test_a_decision_is_made_once(tmp_path: Path) -> None:
    assert halving.claim(tmp_path, 1, "a", 2)
    assert not halving.claim(tmp_path, 1, "a", 2)  # the same decision again: a no-op, no second slot
    assert sorted(p.name for p in (tmp_path / "slots" / "1").iterdir()) == ["0"]
    assert halving.claim(tmp_path, 1, "b", 2)
    assert not halving.claim(tmp_path, 1, "c", 2)  # no slot left
    assert halving.report(tmp_path, 1, "a", 0.5)
    assert not halving.report(tmp_path, 1, "a", 0.9)  # the first report stays
    assert halving.read_reports(tmp_path, 1)["a"]["metric"] == 0.5
    # One requeue per promotion, whoever asks first; a refused one may be tried again.
    assert halving.first_requeue(tmp_path, 1, "a")
    assert not halving.first_requeue(tmp_path, 1, "a")
    halving.forget_requeue(tmp_path, 1, "a")
    assert halving.first_requeue(tmp_path, 1, "a")


def test_rungs_from_min_epochs() -> None:
    assert halving_config.settings({"min_epochs": 1}, 10) == halving.Settings((1, 3, 9), 3, "primary", "max")
    assert halving_config.settings({"min_epochs": 2, "eta": 2}, 9).rungs == (2, 4, 8)  # type: ignore[union-attr]
    assert halving_config.settings({"rungs": [1, 2], "mode": "min"}, 3).mode == "min"  # type: ignore[union-attr]


BASE = """
[train]
model = "builtin:tiny"
engine = "torch"
epochs = 3
[data]
dataset = "builtin:synthetic"
[sweep.grid]
"train.lr" = [1e-4, 1e-3, 1e-2]
"""


@pytest.mark.parametrize(
    ("table", "wanted"),
    [
        ("rungs = [1, 3]", "sweep.halving.rungs: rung 3 is not below train.epochs = 3"),
        ("rungs = [2, 1]", "sweep.halving.rungs: must increase: 1 follows 2"),
        ("eta = 1", "sweep.halving.eta: must be an integer from 2"),
        ("min_epochs = 3", "sweep.halving.min_epochs: 3 leaves no rung below train.epochs = 3"),
        ('metric = "val_loss"', "sweep.halving.metric: 'val_loss' is not a validation metric; use one of accuracy,"),
        ('mode = "up"', "sweep.halving.mode: must be max or min"),
        ("rungs = [1]\nmin_epochs = 1", "sweep.halving.min_epochs: give rungs or min_epochs, not both"),
        ("etaa = 2", "sweep.halving.etaa: unknown key"),
    ],
)
def test_validate_refuses(tmp_path: Path, table: str, wanted: str) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE + "[sweep.halving]\n" + table + "\n")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert wanted in str(info.value)
    assert "\n" not in str(info.value)


def test_validate_names_the_metrics_of_the_task(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    data = 'dataset = "builtin:synthetic"\npreset = "glue/stsb"'
    path.write_text(BASE.replace('dataset = "builtin:synthetic"', data) + '[sweep.halving]\nmetric = "accuracy"\n')
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(info.value).endswith(
        "sweep.halving.metric: 'accuracy' is not a validation metric of regression jobs; use one of pearson, spearman, mse"
    )


def test_validate_refuses_halving_without_a_sweep(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE.replace('[sweep.grid]\n"train.lr" = [1e-4, 1e-3, 1e-2]\n', "") + "[sweep.halving]\neta = 3\n")
    with pytest.raises(ConfigError, match=r"sweep.halving: halving compares the jobs of a sweep"):
        config.load(path)


@pytest.mark.parametrize(
    ("table", "data", "metric", "mode"),
    [
        # The default: the task's primary validation metric, and its direction.
        ("", "", "primary", "max"),  # problem type "auto": each job names its primary once it read its data
        ("", 'preset = "glue/cola"', "mcc", "max"),
        ("", 'preset = "glue/stsb"', "pearson", "max"),
        ("", 'problem_type = "regression"\nprimary_metric = "mse"', "mse", "min"),
        ("", 'problem_type = "multi_label"', "micro_f1", "max"),
        ('metric = "mse"', 'problem_type = "regression"', "mse", "min"),
        ('metric = "spearman"\nmode = "min"', 'preset = "glue/stsb"', "spearman", "min"),
        ('metric = "val_acc"', "", "accuracy", "max"),  # the older name of the validation accuracy
    ],
)
def test_validate_accepts(tmp_path: Path, table: str, data: str, metric: str, mode: str) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE.replace("[data]\n", f"[data]\n{data}\n") + f"[sweep.halving]\nrungs = [1, 2]\n{table}\n")
    exp = config.load(path)
    found = halving_config.settings(exp.sweep.halving, exp.train.epochs, exp.data)
    assert found == halving.Settings((1, 2), 3, metric, mode)


def test_a_sweep_of_other_tasks_or_primaries_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE + '"data.preset" = ["glue/cola", "glue/stsb"]\n[sweep.halving]\nrungs = [1]\n')
    with pytest.raises(ConfigError, match=r"sweep.halving: the sweep varies data.preset; halving compares jobs"):
        config.load(path)
    path.write_text(BASE + '"data.primary_metric" = ["mcc", "accuracy"]\n[sweep.halving]\nrungs = [1]\n')
    with pytest.raises(ConfigError, match=r"sweep.halving.metric: the sweep varies data.primary_metric"):
        config.load(path)
    path.write_text(path.read_text() + 'metric = "mcc"\n')  # named: every job compares MCC
    assert halving_config.settings(config.load(path).sweep.halving, 3, config.load(path).data).metric == "mcc"


def test_a_job_refuses_a_rung_metric_its_task_does_not_score() -> None:
    assert halving.job_metric_problem("primary", "regression", 1) is None
    assert halving.job_metric_problem("mcc", "single_label", 3) is None
    assert halving.job_metric_problem("pearson", "single_label", 2) == (
        "'pearson' is not scored for single_label; this job's validation scores accuracy, macro_f1, f1, mcc"
    )
    assert halving.job_metric_problem("f1", "single_label", 3) == (
        "'f1' is the F1 of class 1 of two classes; this job's validation scores accuracy, macro_f1, mcc"
    )


def _job(tmp_path: Path, name: str, metric: str, mode: str, epochs: list[dict[str, float]]) -> tuple[Any, Any]:
    spec = SimpleNamespace(
        halving={"rungs": [1], "eta": 2, "metric": metric, "mode": mode},
        probe={},
        run_dir=str(tmp_path),
        job=name,
        checkpoint_dir=tmp_path / name / "checkpoints",
    )
    return spec, SimpleNamespace(val_metrics_per_epoch=epochs, primary_metric="pearson", paused_at=0, interrupted=False)


@pytest.mark.parametrize(
    ("metric", "mode", "name", "winner"),
    [("mse", "min", "mse", "a"), ("spearman", "max", "spearman", "b"), ("primary", "max", "pearson", "a")],
)
def test_a_rung_compares_the_chosen_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metric: str, mode: str, name: str, winner: str
) -> None:
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)  # not a Slurm job: nothing to requeue
    # a is better by Pearson and MSE, b by Spearman: who goes on says which metric the rung compared.
    scores = {"a": {"pearson": 0.9, "spearman": 0.1, "mse": 0.2}, "b": {"pearson": 0.5, "spearman": 0.8, "mse": 0.9}}
    went_on = {}
    for job in ("a", "b"):
        spec, stats = _job(tmp_path, job, metric, mode, [scores[job]])
        went_on[job] = halving.goes_on(spec, stats, 1, 0, lambda values: values)
        assert stats.paused_at == (0 if went_on[job] else 1) and stats.interrupted == (not went_on[job])
    reports = halving.read_reports(halving.root(tmp_path), 1)
    assert {job: (r["name"], r["metric"]) for job, r in reports.items()} == {j: (name, scores[j][name]) for j in "ab"}
    assert halving.promoted(halving.root(tmp_path), 1) == {winner}
    assert went_on["b"] == (winner == "b")  # a reported first, alone: it went on only if promoted later
    spec, stats = _job(tmp_path, "a", metric, mode, [scores["a"]])
    assert halving.goes_on(spec, stats, 2, 0, lambda values: values)  # not a rung: nothing asked


def test_every_rank_follows_rank_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks sum what they bring (a collective): rank 0 brings its answer, the others nothing, so a
    pause of rank 0 stops them all (the others once brought 1: a job of several ranks never paused)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    spec, stats = _job(tmp_path, "a", "pearson", "max", [{"pearson": 0.5}])  # alone at its rung: it pauses
    brought: list[float] = []

    def rank_1(values: list[float]) -> list[float]:
        brought.append(values[0])
        return [values[0] + 0.0]  # rank 0 brings 0: paused

    assert not halving.goes_on(spec, stats, 1, 1, rank_1) and stats.paused_at == 1
    assert brought == [0.0] and not (tmp_path / "a" / "checkpoints").exists()  # rank 1 wrote nothing
    spec, stats = _job(tmp_path, "a", "pearson", "max", [{"pearson": 0.5}])
    assert not halving.goes_on(spec, stats, 1, 0, lambda values: [values[0] + brought[0]])
    assert stats.paused_at == 1 and halving.pause_marker(tmp_path / "a" / "checkpoints").exists()


def test_a_promotion_no_job_could_requeue_is_left_to_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bin_dir: Path
) -> None:
    """In a container's image there is no scontrol: the job that promotes a paused one cannot requeue it,
    and must not keep the requeue for itself (then no `jobgen status` would make it)."""
    monkeypatch.setenv("PATH", str(bin_dir))  # nothing but the stand-ins
    paused = {"requeue_id": "77_2"}
    said = halving.requeue_promoted(tmp_path, 1, "p", paused)
    assert said == "no scontrol here: `jobgen status` requeues 77_2"
    assert halving.first_requeue(tmp_path, 1, "p")  # still free: status gets it
    halving.forget_requeue(tmp_path, 1, "p")
    stub_tool(bin_dir, "scontrol", 'echo "JobId=77 JobState=COMPLETED"; [ "$1" = requeue ] && exit 1; exit 0\n')
    assert "rc 1" in str(halving.requeue_promoted(tmp_path, 1, "p", paused))
    assert halving.first_requeue(tmp_path, 1, "p")  # refused by Slurm: given back too
    halving.forget_requeue(tmp_path, 1, "p")
    stub_tool(bin_dir, "scontrol", 'echo "JobId=77 JobState=COMPLETED"; exit 0\n')
    assert "rc 0" in str(halving.requeue_promoted(tmp_path, 1, "p", paused))
    assert halving.requeue_promoted(tmp_path, 1, "p", paused) is None  # requeued once: nobody does it again


def _finished_run(tmp_path: Path, metric: str) -> tuple[Path, list[Any]]:
    """A local halving run on disk that has ended: a finished (promoted at rung 1), b stopped there."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = {
        "halving": {"rungs": [1], "eta": 2, "metric": metric, "mode": "max"},
        "jobs": [{"name": n, "dir": f"jobs/{n}", "state": "COMPLETED"} for n in ("a", "b")],
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "jobs" / "a").mkdir(parents=True)
    (run_dir / "jobs" / "a" / "result.json").write_text("{}\n")  # promoted, then finished
    base = halving.root(run_dir)
    halving.report(base, 1, "a", 0.9, name="pearson")
    halving.report(base, 1, "b", -0.25, name="pearson")
    assert halving.claim(base, 1, "a", 1)
    read = [SimpleNamespace(name=n, state=State.COMPLETED, finished=n == "a") for n in ("a", "b")]
    rungs = halving_view.rungs_of(SimpleNamespace(manifest=manifest, run_dir=run_dir, jobs=read))
    jobs = [
        SimpleNamespace(
            run_dir=run_dir,
            name=name,
            result=result,
            rungs=rungs(job, result is not None),
            state=State.COMPLETED,
            backend="local",
            source=SimpleNamespace(entry={"submitted_at": "2026-12-06T10:00:00+00:00", **ran}),
            usage=None,
            started_at=None,
            train={"epochs": 3},
        )
        for job, (name, result, ran) in zip(
            read, (("a", object(), {"ran_s": 1800.0}), ("b", None, {"ran_s": 600.0})), strict=True
        )
    ]
    return run_dir, jobs


@pytest.mark.parametrize("metric", ["primary", "pearson"])
def test_summary_and_report_name_the_rung_metric(tmp_path: Path, metric: str) -> None:
    _, (a, b) = _finished_run(tmp_path, metric)
    assert halving_view.fields([a]) == {
        "outcome": "finished",
        "rung": 1,
        "rung_metrics": [0.9],
        "rung_metric": "pearson",
    }
    assert halving_view.fields([b])["outcome"] == "stopped"
    assert halving_view.rung_text(b.rungs) == "pearson 1:-0.2500"  # type: ignore[arg-type]
    lines = [SimpleNamespace(jobs=[job], label=job.name) for job in (a, b)]
    chart = halving_view.rung_chart(lines, {id(line): "#000" for line in lines})
    assert "Halving: pearson at each rung" in chart and "(%)" not in chart  # a correlation, not a percentage


def test_a_local_runs_hours_are_its_jobs_wall_hours(tmp_path: Path) -> None:
    _, jobs = _finished_run(tmp_path, "primary")
    # a: 0.5 h to the end; b: 600 s for 1 of 3 epochs, 0.5 h for all of them.
    assert halving_view.totals(jobs, "cpu_hours") == {
        "hours_kind": "wall",
        "hours_used": round(2400 / 3600, 6),
        "full_sweep_hours": 1.0,
    }
    # Under the summary's totals (terminal, markdown, report): what halving saved, in the jobs' hours.
    assert halving_view.totals_text({"jobs": 2, **halving_view.totals(jobs, "cpu_hours")}) == [
        "halving: 0.667 h (wall clock) used; about 1 h (wall clock) for every job to train every epoch (67% of it)"
    ]
    jobs[1].source.entry.pop("ran_s")  # recorded before the time was kept: unknown, never a guess
    assert halving_view.totals(jobs, "cpu_hours")["hours_used"] is None
    assert halving_view.totals_text(halving_view.totals(jobs, "cpu_hours"))[0].startswith(
        "halving: the hours of the sweep without it are unknown"
    )
    assert halving_view.totals_text({"jobs": 2, "gpu_hours": 1.0}) == []  # no halving, no line


def test_the_local_backend_adds_up_a_jobs_runs_and_reads_a_launchers_pause(tmp_path: Path) -> None:
    from jobgen.backends.local import RAN_S, SCHEDULER

    job_dir = tmp_path / "jobs" / "j"
    (job_dir / "checkpoints").mkdir(parents=True)
    marker = halving.pause_marker(job_dir / "checkpoints")
    entry: dict[str, Any] = {"name": "j", "dir": "jobs/j", "submit_command": ["bash", "-c", "sleep 0.3"]}
    first = SCHEDULER.submit(tmp_path, entry)
    again = SCHEDULER.submit(tmp_path, {**entry, **first})  # promoted after its pause: it runs again
    assert 0.3 <= first[RAN_S] < 5 and again[RAN_S] >= first[RAN_S] + 0.3
    assert again["state"] == "COMPLETED"
    # torchrun ends with 1 when its ranks paused: the marker written by this run says they did.
    pauses = ["bash", "-c", f"echo 1 > {marker}; exit 1"]
    assert SCHEDULER.submit(tmp_path, {**entry, "submit_command": pauses})["state"] == "COMPLETED"
    os.utime(marker, (1, 1))  # an earlier run's marker: this failure is a failure
    assert SCHEDULER.submit(tmp_path, {**entry, "submit_command": ["bash", "-c", "exit 1"]})["state"] == "FAILED"


CONTAINED = """
[experiment]
name = "ct"
[slurm]
gpus_per_node = 1
[train]
engine = "lightning"
model = "builtin:tiny"
epochs = 3
[data]
dataset = "builtin:synthetic"
[container]
runtime = "pyxis"
image = "ubuntu:22.04"
[sweep.grid]
"train.lr" = [1e-4, 1e-3, 1e-2]
[sweep.halving]
rungs = [1]
"""


def test_jobs_in_containers_carry_what_halving_needs(tmp_path: Path, runner: Any) -> None:
    """The rung files live in the run folder: mounted at its own path. Each job's spec has the rungs, and
    its script's pause guard reads the marker the job writes (Slurm's variables pass into the image)."""
    from jobgen.cli import main

    path, root = tmp_path / "ct.toml", tmp_path / "runs"
    path.write_text(CONTAINED)
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "ct").iterdir()
    want = {"rungs": [1], "eta": 3, "metric": "primary", "mode": "max"}
    assert json.loads((run_dir / "manifest.json").read_text())["halving"] == want
    for job in ("lr-0.0001", "lr-0.001", "lr-0.01"):
        spec = json.loads((run_dir / "jobs" / job / "spec.json").read_text())
        assert spec["halving"] == want and spec["run_dir"] == str(run_dir)
        script = (run_dir / "jobs" / job / "job.sbatch").read_text()
        assert f"--container-mounts={root}:{root}" in script
        checkpoints = Path(spec["job_dir"]) / "checkpoints"
        guard = f'jobgen_paused={checkpoints}/.paused-"${{SLURM_JOB_ID:-local}}-${{SLURM_RESTART_COUNT:-0}}"'
        assert guard in script
        env = {"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "2"}
        assert halving.pause_marker(checkpoints, env) == checkpoints / ".paused-41-2"  # as the guard names it


def test_submitit_ends_a_paused_job_as_planned() -> None:
    """submitit writes its own batch script, which reads no pause marker: its jobs' ranks end a pause with
    status 0 (else submitit records a failure and Slurm a FAILED job), jobs without halving as before."""
    from jobgen.backends.submitit import executor_parameters

    slurm = {"nodes": 1, "ntasks_per_node": 1, "cpus_per_task": 2, "gpus_per_node": 0, "mem": "", "time": "1:00"}
    slurm |= {"partition": "", "account": "", "qos": "", "constraint": "", "exclusive": False, "extra": {}}
    spec: dict[str, Any] = {"experiment": "e", "job": "j", "slurm": slurm}
    assert executor_parameters(spec, Path("/r/setup.sh"))["slurm_setup"] == ["source /r/setup.sh"]
    spec["halving"] = {"rungs": [1], "eta": 3, "metric": "primary", "mode": "max"}
    setup = executor_parameters(spec, Path("/r/setup.sh"))["slurm_setup"]
    assert setup == ["source /r/setup.sh", f"export {halving.PAUSED_EXIT_ENV}=0"]
    assert halving.paused_status({halving.PAUSED_EXIT_ENV: "0"}) == 0
    assert halving.paused_status({}) == halving.paused_status({halving.PAUSED_EXIT_ENV: "x"}) == halving.EXIT_PAUSED


def _halving_run(root: Path, jobs: list[Any], found: halving.Settings, reports: dict[str, float]) -> Path:
    """A run of synthetic jobs (tests/data/summary/synth) that halves with `found`, each job of
    `reports` reported at rung 1 with its metric."""
    import json

    from tests.data.summary import synth

    run = synth.write_run(root, "halv", jobs)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["halving"] = found.record()
    (run / "manifest.json").write_text(json.dumps(manifest))
    for job, metric in reports.items():
        assert halving.report(halving.root(run), 1, job, metric)
    return run


def test_summary_and_status_show_what_halving_did_to_each_job(tmp_path: Path, runner) -> None:
    """A halving run read from its files: the job a decision promoted past the rung and that finished
    shows COMPLETED, the two that ended at the rung without a result STOPPED@1 (never FAILED or
    COMPLETED), each with the rung and the metric it reported there."""
    import json

    from jobgen.cli import main
    from tests.data.summary import synth

    jobs = [
        synth.FakeJob("best", sweep={"train.lr": 1}, state="COMPLETED"),
        synth.FakeJob("mid", sweep={"train.lr": 2}, state="FAILED", result=None),
        synth.FakeJob("low", sweep={"train.lr": 3}, state="FAILED", result=None),
    ]
    found = halving.Settings((1,), 3, "accuracy", "max")
    run = _halving_run(tmp_path / "runs", jobs, found, {"best": 0.9, "mid": 0.6, "low": 0.3})
    assert halving.settle(halving.root(run), 1, found) == ["best"]
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {row["config"]: row for row in json.loads(result.stdout)["rows"]}
    assert {job: (row["state"], row["outcome"], row["rung"], row["rung_metrics"]) for job, row in rows.items()} == {
        "best": ("COMPLETED", "finished", 1, [0.9]),
        "mid": ("STOPPED@1", "stopped", 1, [0.6]),
        "low": ("STOPPED@1", "stopped", 1, [0.3]),
    }
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "status", str(run)])
    assert result.exit_code == 0, result.output
    states = {line.split()[0]: line.split()[3] for line in result.stdout.splitlines()[2:]}
    assert states == {"best": "COMPLETED", "mid": "STOPPED@1", "low": "STOPPED@1"}, result.stdout


def test_jobs_halving_ended_are_no_failures_to_explain_count_or_requeue(
    tmp_path: Path, runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on the test cluster: a job halving stopped exits 0 without a result, which the state rule
    reads as FAILED; `requeue` queued such jobs again, `runs` counted them FAILED and the summary and
    report explained them by their log's last line. A job of the same run that failed still is one."""
    import json

    from jobgen.cli import main
    from tests.core.conftest import fake_squeue
    from tests.data.summary import synth
    from tests.support.stub_tools import install_stubs

    paused = (
        "training: epoch 1/3 validation acc 0.6000\njobgen: paused at halving rung 1; a promotion requeues the job\n"
    )
    jobs = [
        synth.FakeJob("best", sweep={"train.lr": 1}, state="COMPLETED"),
        synth.FakeJob("mid", sweep={"train.lr": 2}, state="FAILED", result=None, logs={"slurm-4001.out": paused}),
        synth.FakeJob("low", sweep={"train.lr": 3}, state="FAILED", result=None, logs={"slurm-4002.out": paused}),
        synth.FakeJob(
            "broke", sweep={"train.lr": 4}, state="FAILED", result=None, logs={"slurm-4003.out": "RuntimeError: boom\n"}
        ),
    ]
    root = tmp_path / "runs"
    found = halving.Settings((1,), 3, "accuracy", "max")
    run = _halving_run(root, jobs, found, {"best": 0.9, "mid": 0.6, "low": 0.3})
    assert halving.settle(halving.root(run), 1, found) == ["best"]

    listed = runner.invoke(main, ["--output-root", str(root), "runs"])
    assert listed.exit_code == 0 and "2 STOPPED@1, 1 COMPLETED, 1 FAILED" in listed.output, listed.output

    result = runner.invoke(main, ["--output-root", str(root), "summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {row["config"]: row for row in json.loads(result.stdout)["rows"]}
    assert {job: (row["state"], row["problem"], row["hint"]) for job, row in rows.items() if job != "broke"} == {
        "best": ("COMPLETED", None, None),
        "mid": ("STOPPED@1", None, None),
        "low": ("STOPPED@1", None, None),
    }
    assert rows["broke"]["state"] == "FAILED" and "RuntimeError: boom" in rows["broke"]["problem"]
    page = tmp_path / "r.html"
    assert runner.invoke(main, ["--output-root", str(root), "report", str(run), "-o", str(page)]).exit_code == 0
    html = page.read_text()
    assert html.count('<td class="state-planned">STOPPED@1</td>') == 2  # grey, not a failure's red
    assert '<td class="state-bad">FAILED</td>' in html and '<td class="state-done">COMPLETED</td>' in html
    problems = html.split("<h2>Jobs without a result</h2>")[1]
    assert "<b>broke</b>" in problems and "<b>mid</b>" not in problems and "<b>low</b>" not in problems

    stubs = install_stubs(tmp_path, monkeypatch, {"scontrol": 'echo "scontrol $*" >> "$STATE/argv"\n'})
    fake_squeue(monkeypatch, lambda ids: {})  # a controller past MinJobAge: the records' states stand
    result = runner.invoke(main, ["--output-root", str(root), "requeue", str(run)])
    assert result.exit_code == 0, result.output
    assert (stubs / "argv").read_text().splitlines() == ["scontrol requeue 4003"], result.output
    result = runner.invoke(main, ["--output-root", str(root), "requeue", str(run), "mid"])
    assert result.exit_code == 0 and (stubs / "argv").read_text().count("scontrol") == 1, result.output
    # PAUSED now, not STOPPED: "broke" is queued again, and its report could still promote "mid".
    assert "mid (PAUSED@1, job 4001): skipped: halving ended it at rung 1 as planned" in result.output


def test_a_job_a_promotion_requeued_after_its_pause_was_recorded_is_asked_again(
    tmp_path: Path, runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on the test cluster: a status recorded a paused job's end (FAILED under its label: no
    result); a later job promoted it and requeued it itself, so no command recorded that; each status
    after showed it FAILED from the record while it ran again. Slurm is asked about it again."""
    import json

    from jobgen.cli import main
    from jobgen.states import JobInfo, State
    from tests.core.conftest import fake_squeue
    from tests.data.summary import synth

    jobs = [synth.FakeJob(f"j{i}", sweep={"train.lr": i}, state="FAILED", result=None) for i in range(4)]
    run = synth.write_run(tmp_path / "runs", "halv", jobs)
    manifest = json.loads((run / "manifest.json").read_text())
    found = halving.Settings((1,), 2, "accuracy", "max")
    manifest["halving"] = found.record()
    for entry in manifest["jobs"]:
        entry["exit_code"] = "0:0"
    (run / "manifest.json").write_text(json.dumps(manifest))
    base = halving.root(run)
    for i, metric in enumerate((0.3, 0.9, 0.6, 0.1)):
        assert halving.report(base, 1, f"j{i}", metric)
    assert halving.settle(base, 1, found) == ["j1", "j2"]
    assert halving.first_requeue(base, 1, "j1") and halving.first_requeue(
        base, 1, "j2"
    )  # by the job that promoted them
    asked: list[list[str]] = []

    def slurm(ids: list[str]) -> dict[str, JobInfo]:
        asked.append(sorted(ids))
        return {"4001": JobInfo(State.PENDING), "4002": JobInfo(State.RUNNING)}

    fake_squeue(monkeypatch, slurm)
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "status", str(run)])
    assert result.exit_code == 0, result.output
    shown = {line.split()[0]: line.split()[3] for line in result.stdout.splitlines()[2:]}
    assert shown == {"j0": "PAUSED@1", "j1": "PENDING", "j2": "RUNNING", "j3": "PAUSED@1"}, result.output
    assert asked == [["4001", "4002"]]
    # j2 finishes unseen (its pause is still the state recorded): asked until its COMPLETED (and
    # Slurm's times) is recorded, then no more.
    doc = json.loads((run / "manifest.json").read_text())
    doc["jobs"][2]["state"] = "FAILED"
    (run / "manifest.json").write_text(json.dumps(doc))
    for journal in run.glob(".journal-*"):
        journal.unlink()
    done = synth.write_run(tmp_path / "other", "halv", [synth.FakeJob("j2", state="COMPLETED")])
    (run / "jobs" / "j2" / "result.json").write_bytes((done / "jobs" / "j2" / "result.json").read_bytes())
    answers = {"4001": JobInfo(State.PENDING), "4002": JobInfo(State.COMPLETED)}
    fake_squeue(monkeypatch, lambda ids: asked.append(sorted(ids)) or {i: answers[i] for i in ids})
    for _ in range(2):
        assert runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "status", str(run)]).exit_code == 0
    assert asked[1:] == [["4001", "4002"], ["4001"]]
    assert json.loads((run / "manifest.json").read_text())["jobs"][2]["state"] == "COMPLETED"


CHAINED = BASE.replace("[train]", "[slurm]\nchain = 3\n[train]") + "[sweep.halving]\nrungs = [1]\n"


def _chain_script(tmp_path: Path, runner: Any, text: str, *extra: str) -> str:
    from jobgen.cli import main

    tmp_path.mkdir(exist_ok=True)
    path, root = tmp_path / "chained.toml", tmp_path / "runs"
    path.write_text(text)
    result = runner.invoke(main, ["--output-root", str(root), *extra, "submit", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "chained").iterdir()
    return (run_dir / "jobs" / "lr-0.001" / "job.sbatch").read_text()


def test_a_chain_holds_its_later_segments_when_it_pauses_and_releases_them_when_it_resumes(
    tmp_path: Path, runner: Any, bin_dir: Path
) -> None:
    """The script's hold and release, run with stand-ins for squeue and scontrol: a pausing segment holds
    the segments that wait on it, one after the other (not another job's), and records them; run again,
    it makes the first wait on it anew (Slurm dropped the fulfilled dependency) before it releases them."""
    script = _chain_script(tmp_path, runner, CHAINED)
    assert "jobgen_chain_hold || true" in script and "\njobgen_chain_release || true\n" in script
    assert "jobgen_chain" not in _chain_script(tmp_path / "plain", runner, CHAINED.split("[sweep.halving]")[0])
    start = script.index("jobgen_held=")
    functions = script[start : script.index("jobgen_chain_release || true", start)]
    calls = tmp_path / "calls"
    stub_tool(
        bin_dir,
        "squeue",
        "printf '%s\\n' '12 afterany:11(unfulfilled)' '10 afterany:9(unfulfilled)' "
        "'9 afterany:8(unfulfilled)' '11 afterany:99(unfulfilled)'\n",
    )
    stub_tool(bin_dir, "scontrol", f'echo "$*" >>{calls}; exit "${{FAIL:-0}}"\n')
    held = Path(script.split("jobgen_held=", 1)[1].split('"', 1)[0].strip("'") + "8")
    held.parent.mkdir(parents=True)

    def run(what: str, **env: str) -> str:
        import subprocess

        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{functions}\n{what}"],
            env={**os.environ, "SLURM_JOB_ID": "8", **env},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    assert "held the chain's later segments 9 10" in run("jobgen_chain_hold")
    assert calls.read_text() == "hold 9 10\n" and held.read_text().split() == ["9", "10"]
    calls.unlink()
    assert "released the chain's later segments 9 10" in run("jobgen_chain_release")
    assert calls.read_text() == "update JobId=9 Dependency=afterany:8\nrelease 9 10\n" and not held.exists()
    calls.unlink()
    run("jobgen_chain_release")  # nothing held: nothing asked
    assert not calls.exists()
    assert "hold 9 10 failed" in run("jobgen_chain_hold", FAIL="1") and not held.exists()


def test_a_paused_chain_reads_as_paused_is_requeued_when_promoted_and_cancelled_when_stopped(
    tmp_path: Path,
) -> None:
    """A chain whose segment paused at a rung is pending (its later segments held), never running: it reads
    as paused while the sweep goes on, its paused segment (the one that reported) is requeued when a
    decision promotes it, and once the sweep has ended it is stopped and its held segments cancelled."""
    from jobgen.states import JobInfo

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    found = halving.Settings((1,), 2, "accuracy", "max")
    manifest = {"backend": "sbatch", "halving": found.record(), "jobs": []}
    base = halving.root(run_dir)
    halving.report(base, 1, "a", 0.5, requeue_id="11")
    asked: list[tuple[str, Any]] = []
    backend = SimpleNamespace(
        runs_here=False,
        requeue=lambda target, what: asked.append(("requeue", target)),
        cancel=lambda ids: asked.append(("cancel", ids)),
    )

    def chain(name: str, states: list[str]) -> Any:
        live = JobInfo(State.PENDING, extra={"segments": states, "segment": 2})
        state = State.PENDING if any(s == "PENDING" for s in states) else State(states[-1])
        return SimpleNamespace(name=name, state=state, finished=False, segments=("10", "11", "12"), live=live)

    paused = chain("a", ["COMPLETED", "COMPLETED", "PENDING"])  # paused in its second segment, the third held
    running = SimpleNamespace(name="b", state=State.RUNNING, finished=False, segments=(), live=None)
    run = SimpleNamespace(run_dir=run_dir, manifest=manifest, jobs=[paused, running])
    assert halving_view.labels(run, found)["a"].label() == "PAUSED@1"
    assert halving_view.ended(paused, halving_view.Board.read(run_dir, found))
    fresh = chain("c", ["RUNNING", "PENDING", "PENDING"])  # not at a rung yet: running, not ended
    fresh.state = State.PENDING
    assert not halving_view.ended(fresh, halving_view.Board.read(run_dir, found))

    import jobgen.backends as backends_module

    original = backends_module.get
    backends_module.get = lambda name: backend  # type: ignore[assignment]
    try:
        halving.report(base, 1, "b", 0.9)
        halving.report(base, 1, "d", 0.1)
        halving.report(base, 1, "e", 0.2)  # n = 4, eta 2: two slots, a is second best
        said = halving_view.promote(run, found)
        assert ("requeue", "11") in asked, said  # the segment that paused, not the chain's first
        asked.clear()
        stopped = chain("a", ["COMPLETED", "COMPLETED", "PENDING"])
        halving.forget_requeue(base, 1, "a")
        for name in halving.promoted(base, 1):
            (base / "decisions" / "1" / name).unlink()
        done = SimpleNamespace(name="b", state=State.COMPLETED, finished=True, segments=(), live=None)
        run = SimpleNamespace(run_dir=run_dir, manifest=manifest, jobs=[stopped, done])
        assert halving_view.cancel_stopped(run, found, backend) == [
            "halving: cancelled a's held segments 12: stopped at rung 1"
        ]
        assert asked == [("cancel", ["12"])]
    finally:
        backends_module.get = original  # type: ignore[assignment]
