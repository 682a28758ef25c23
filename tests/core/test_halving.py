"""Successive halving: the pure rule against a brute-force reference, the decision files under real
races (threads and processes on a real file system), and [sweep.halving]'s validation."""

from __future__ import annotations

import math
import multiprocessing
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen.errors import ConfigError
from jobgen.experiment import config
from jobgen.experiment import halving as halving_config
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
    assert halving_config.settings({"min_epochs": 1}, 10) == halving.Settings((1, 3, 9), 3, "val_acc", "max")
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
        ('metric = "val_loss"', "sweep.halving.metric: 'val_loss' is not recorded per epoch"),
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


def test_validate_refuses_halving_without_a_sweep(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE.replace('[sweep.grid]\n"train.lr" = [1e-4, 1e-3, 1e-2]\n', "") + "[sweep.halving]\neta = 3\n")
    with pytest.raises(ConfigError, match=r"sweep.halving: halving compares the jobs of a sweep"):
        config.load(path)


def test_validate_accepts(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE + "[sweep.halving]\nrungs = [1, 2]\n")
    exp = config.load(path)
    assert halving_config.settings(exp.sweep.halving, exp.train.epochs) == halving.Settings((1, 2), 3, "val_acc", "max")


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
    run = synth.write_run(tmp_path / "runs", "halv", jobs)
    manifest = json.loads((run / "manifest.json").read_text())
    found = halving.Settings((1,), 3, "val_acc", "max")
    manifest["halving"] = found.record()
    (run / "manifest.json").write_text(json.dumps(manifest))
    base = halving.root(run)
    for job, metric in (("best", 0.9), ("mid", 0.6), ("low", 0.3)):
        assert halving.report(base, 1, job, metric)
    assert halving.settle(base, 1, found) == ["best"]
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
