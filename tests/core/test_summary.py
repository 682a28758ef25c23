"""jobgen.results.summary: one table of time and accuracy, in every format, compared against the files written."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.errors import JobgenError
from jobgen.results.columns import duration, whole_seconds
from jobgen.results.summary import FIELDS, HEADERS, TERMINAL_HEADERS, config_key, summarize
from tests.data.summary.synth import FAULTS, FakeJob, write_run

REPO = Path(__file__).resolve().parents[2]

# Three configurations with different numbers everywhere, so a value shown in the wrong row is caught.
CONFIGS = [
    FakeJob(
        "engine-torch",
        {"train.engine": "torch"},
        engine="torch",
        strategy="auto",
        train_s=300.0,
        samples_per_s=100.0,
        test_acc=0.80,
        best_val_acc=0.81,
        test_f1=0.79,
        queue_s=12.0,
        requeue_count=1,
    ),
    FakeJob(
        "engine-lightning",
        {"train.engine": "lightning"},
        engine="lightning",
        train_s=150.0,
        samples_per_s=200.0,
        test_acc=0.85,
        best_val_acc=0.86,
        test_f1=0.84,
        queue_s=20.0,
    ),
    FakeJob(
        "engine-fabric",
        {"train.engine": "fabric"},
        engine="fabric",
        train_s=120.0,
        compile=True,
        samples_per_s=250.0,
        test_acc=0.86,
        best_val_acc=0.87,
        test_f1=0.85,
        queue_s=7.0,
        peak_gpu_mb=3100.0,
    ),
]


def _rows(text: str) -> dict[str, dict[str, str]]:
    return {r["config"]: r for r in csv.DictReader(io.StringIO(text))}


def test_csv_and_json_carry_the_result_files_values(tmp_path: Path) -> None:
    run = write_run(tmp_path, "exp", CONFIGS)
    by_csv = _rows(summarize([run], fmt="csv"))
    by_json = {r["config"]: r for r in json.loads(summarize([run], fmt="json"))["rows"]}
    base = CONFIGS[0].train_s  # the torch job is the default baseline
    for job in CONFIGS:
        result = json.loads((run / "jobs" / job.name / "result.json").read_text())
        expected = {
            "engine": result["engine"],
            "strategy": result["strategy"],
            "precision": result["precision"]["effective"],
            "state": "COMPLETED",
            "train_s": result["times_s"]["train"],
            "samples_per_s": result["throughput"]["samples_per_s"],
            "peak_mem_mb": result["peak_memory_mb"]["gpu_max_allocated"],
            "best_val_acc": result["best_val_acc"],
            "test_acc": result["test_acc"],
            "test_f1": result["test_f1"],
            "requeues": result["requeue_count"],
            "queue_wait_s": job.queue_s,
            "speedup": round(base / job.train_s, 6),
        }
        for key, value in expected.items():
            assert by_json[job.name][key] == pytest.approx(value), key
            # Counts stay integers (requeues 0, not 0.0); measured numbers are floats even when whole.
            shown = value if key == "requeues" else float(value) if isinstance(value, int) else value
            assert by_csv[job.name][key] == str(shown), key
        assert isinstance(by_json[job.name]["requeues"], int)
        assert by_csv[job.name]["compile"] == ("true" if result["compile"] else "false")  # as JSON says it
        assert by_csv[job.name]["baseline"] in ("true", "false")
        assert by_json[job.name]["nodes"] == result["nodes"]
        assert by_json[job.name]["devices_per_node"] == result["devices_per_node"]
        assert by_json[job.name]["compile"] is result["compile"]
    assert list(next(iter(by_csv.values()))) == FIELDS


def test_the_primary_metric_is_named_and_the_predictions_linked(tmp_path: Path) -> None:
    """A CoLA-like job (primary MCC, predictions saved) beside an accuracy one: the table names each
    line's primary metric with its value, and the rows carry the metrics by name and the file."""
    jobs = [
        FakeJob("cola", {"data.preset": "glue/cola"}, primary="mcc", mcc=0.4512, predictions=True),
        FakeJob("sst2", {"data.preset": "glue/sst2"}, test_acc=0.91),
    ]
    run = write_run(tmp_path, "glue", jobs)
    text = summarize([run], fmt="table", width=400)
    rows_shown = [ln for ln in text.splitlines() if not ln.startswith("speed-up:")]
    cola = next(ln for ln in rows_shown if "cola" in ln)
    sst2 = next(ln for ln in rows_shown if "sst2" in ln)
    assert "mcc 0.4512" in cola and "mcc 0.4612" in cola  # test, and the tested epoch's validation
    assert str(run / "jobs" / "cola" / "predictions.csv") in cola or "predictions.csv" in cola
    assert "accuracy 0.9100" in sst2 and "predictions.csv" not in sst2
    rows = {r["config"]: r for r in json.loads(summarize([run], fmt="json"))["rows"]}
    assert rows["cola"]["primary_metric"] == "mcc" and rows["sst2"]["primary_metric"] == "accuracy"
    assert rows["cola"]["test_primary"] == pytest.approx(0.4512)
    assert rows["cola"]["test_metrics"] == {"accuracy": 0.87, "f1": 0.86, "macro_f1": 0.86, "mcc": 0.4512}
    assert rows["cola"]["val_metrics"] == {"accuracy": 0.88, "mcc": 0.4612}  # an undefined metric is left out
    assert rows["cola"]["predictions"] == [f"{run / 'jobs' / 'cola'}/predictions.csv"]
    assert rows["sst2"]["predictions"] is None
    assert Path(rows["cola"]["predictions"][0]).read_text().startswith("row,label,prediction,score")
    by_csv = _rows(summarize([run], fmt="csv"))
    assert json.loads(by_csv["cola"]["test_metrics"]) == rows["cola"]["test_metrics"]


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_human_formats_fill_every_column(tmp_path: Path, fmt: str) -> None:
    run = write_run(tmp_path, "exp", CONFIGS)
    text = summarize([run], fmt=fmt, width=400)
    rows = [ln for ln in text.splitlines() if not ln.startswith("speed-up:")]  # the caption names the baseline
    lines = {job.name: next(ln for ln in rows if job.name in ln) for job in CONFIGS}
    for job in CONFIGS:
        line = lines[job.name]
        for shown in (
            job.engine,
            job.strategy,
            job.precision,
            "1×2",
            "COMPLETED",
            duration(job.train_s),
            whole_seconds(job.queue_s),  # from times recorded to the second
            f"{100 * job.test_acc:.1f}",
            f"{100 * job.best_val_acc:.1f}",
            f"{100 * job.test_f1:.1f}",
            f"{job.samples_per_s:,.1f}",
            f"{job.peak_gpu_mb:,.0f} gpu",
        ):
            assert shown in line, (shown, line)
    assert "baseline" in lines["engine-torch"]
    assert f"{300 / 150:.2f}×" in lines["engine-lightning"] and f"{300 / 120:.2f}×" in lines["engine-fabric"]
    assert "yes" in lines["engine-fabric"] and " no " in lines["engine-torch"]
    for header in HEADERS:
        shown = TERMINAL_HEADERS.get(header, header) if fmt == "table" else header
        assert all(part in text for part in shown.split("\n")), header


def test_narrow_terminal_stacks_two_tables_and_loses_no_column(tmp_path: Path) -> None:
    text = summarize([write_run(tmp_path, "exp", CONFIGS)], width=120)
    torch_lines = [ln for ln in text.splitlines() if ln.startswith("engine-torch")]
    assert len(torch_lines) == 3  # packed in order: each table as wide as fits, then the rest
    assert "auto" in torch_lines[0] and "5m00s" in torch_lines[0] and "baseline" in torch_lines[1]
    assert all(len(line) <= 120 for line in text.split("\n• ", 1)[0].splitlines())
    # No job of these was accounted: those columns would be a table of blanks; one line names them.
    assert "no job has a value in: MFU (%), GPU-h, CPU-h, energy (kWh), time used (%), predictions\n" in text


@pytest.mark.parametrize("width", [40, 58, 80, 100, 120, 160, 250])
def test_every_table_fits_the_screen_and_no_cell_is_folded(tmp_path: Path, width: int) -> None:
    """On any screen, each stacked table fits, and every cell reads whole on its config's line: a
    number folded over two lines ("289." then "6") reads as two numbers."""
    from jobgen.results.collect import collect
    from jobgen.results.summary import apply_baseline, build_lines, cells

    run = write_run(tmp_path, "exp", CONFIGS)
    text = summarize([run], width=width)
    lines = build_lines(collect([run]))
    apply_baseline(lines, None)
    table = text.split("\n• ", 1)[0]  # the notes under the tables wrap as prose
    assert max(len(line) for line in table.splitlines()) <= width
    for line in lines:
        shown = " ".join(ln for ln in table.splitlines() if ln.startswith(line.label + " "))
        for header, value in zip(HEADERS[:-1], cells(line)[:-1], strict=True):
            assert value in shown, (width, header, value, table)


def test_markdown_is_a_pipe_table(tmp_path: Path) -> None:
    text = summarize([write_run(tmp_path, "exp", CONFIGS)], fmt="markdown")
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(rows) == 2 + len(CONFIGS)
    assert {ln.count("|") for ln in rows} == {len(HEADERS) + 1}


def test_runs_of_one_configuration_combine_into_mean_std_n(tmp_path: Path) -> None:
    times, accs = [100.0, 110.0, 126.0], [0.80, 0.82, 0.87]
    runs = [
        write_run(tmp_path, "exp", [FakeJob("a", train_s=t, test_acc=a), FakeJob("b", train_s=50.0)], run_id=f"r{i}")
        for i, (t, a) in enumerate(zip(times, accs, strict=True))
    ]
    rows = {r["config"]: r for r in json.loads(summarize(runs, fmt="json"))["rows"]}
    assert rows["a"]["n"] == 3 and rows["a"]["run"] == "3 runs"
    assert rows["a"]["train_s"] == pytest.approx(statistics.mean(times))
    assert rows["a"]["train_s_std"] == pytest.approx(statistics.stdev(times))
    assert rows["a"]["test_acc"] == pytest.approx(statistics.mean(accs), abs=1e-6)
    assert rows["a"]["test_acc_std"] == pytest.approx(statistics.stdev(accs), abs=1e-6)
    assert rows["b"]["train_s_std"] == 0.0
    table = summarize(runs, width=400)
    assert "a (n=3)" in table and f"{duration(statistics.mean(times))} ± {duration(statistics.stdev(times))}" in table


def test_runs_planned_from_other_settings_are_other_configurations(tmp_path: Path, runner) -> None:
    """Runs that differ by a --set item, a site value or an edit of the file are not repeats of one
    another: each keeps its own line, named by the settings it differs by; runs that differ by the seed
    alone (and the description, and the sweep's other points) still combine."""
    resolved = {
        "r0": '[train]\nlr = 0.003\nseed = 1\n[sweep.grid]\n"train.engine" = ["torch"]\n',
        "r1": '[train]\nlr = 0.001\nseed = 1\n[sweep.grid]\n"train.engine" = ["torch"]\n',
        "r2": '[experiment]\ndescription = "again"\n[train]\nlr = 0.003\nseed = 2\n'
        '[sweep.grid]\n"train.engine" = ["torch", "fabric"]\n',
        "r3": '[train]\nlr = 0.003\nseed = 1\n[slurm]\npartition = "big"\n[sweep.grid]\n"train.engine" = ["torch"]\n',
        # A key set to its default plans what leaving it out plans: a repeat of r0.
        "r4": '[train]\nlr = 0.003\nseed = 3\nweight_decay = 0.01\n[sweep.grid]\n"train.engine" = ["torch"]\n',
    }
    times = {"r0": 100.0, "r1": 300.0, "r2": 120.0, "r3": 90.0, "r4": 140.0}
    runs = []
    for i, (run_id, text) in enumerate(resolved.items()):
        job = FakeJob("engine-torch", {"train.engine": "torch"}, train_s=times[run_id])
        runs.append(write_run(tmp_path / "runs", "exp", [job], run_id=f"20261201-00000{i}-ab1{i}"))
        (runs[-1] / "experiment.resolved.toml").write_text(text)
    rows = {r["config"]: r for r in json.loads(summarize(runs, fmt="json"))["rows"]}
    assert set(rows) == {
        "engine-torch [slurm.partition=default, train.lr=0.001]",
        "engine-torch [slurm.partition=default, train.lr=0.003]",
        "engine-torch [slurm.partition=big, train.lr=0.003]",
    }
    same = rows["engine-torch [slurm.partition=default, train.lr=0.003]"]
    assert same["n"] == 3 and same["run"] == "3 runs" and same["train_s"] == pytest.approx(120.0)
    assert rows["engine-torch [slurm.partition=default, train.lr=0.001]"]["train_s"] == pytest.approx(300.0)
    # One run alone: its label is its name, whatever it was planned from.
    assert [r["config"] for r in json.loads(summarize(runs[1:2], fmt="json"))["rows"]] == ["engine-torch"]
    # The CLI's --all-runs the same way.
    done = runner.invoke(
        main, ["--output-root", str(tmp_path / "runs"), "summary", "exp", "--all-runs", "--format", "csv"]
    )
    assert done.exit_code == 0, done.output
    table = list(csv.DictReader(io.StringIO(done.stdout)))
    assert {(r["config"], r["n"]) for r in table} == {(config, str(row["n"])) for config, row in rows.items()}


def test_seeds_swept_in_one_run_are_one_configuration(tmp_path: Path) -> None:
    jobs = [
        FakeJob(f"strategy-{s}_seed-{seed}", {"train.strategy": s, "train.seed": seed}, strategy=s, train_s=t)
        for s, t in (("ddp", 100.0), ("fsdp", 80.0))
        for seed in (1, 2)
    ]
    rows = json.loads(summarize([write_run(tmp_path, "exp", jobs)], fmt="json"))["rows"]
    assert [(r["config"], r["n"]) for r in rows] == [("strategy-ddp", 2), ("strategy-fsdp", 2)]


def test_no_combine_lists_every_job_of_every_run(tmp_path: Path) -> None:
    runs = [write_run(tmp_path, "exp", [FakeJob("a")], run_id=f"r{i}") for i in range(2)]
    rows = json.loads(summarize(runs, fmt="json", combine=False))["rows"]
    assert [(r["config"], r["run"], r["n"]) for r in rows] == [("r0/a", "r0", 1), ("r1/a", "r1", 1)]


def test_default_baseline_without_torch_is_the_slowest(tmp_path: Path) -> None:
    jobs = [
        FakeJob("fast", train_s=50.0, samples_per_s=200.0),
        FakeJob("slow", train_s=200.0, samples_per_s=50.0),
        FakeJob("mid", train_s=100.0, samples_per_s=100.0),
    ]
    doc = json.loads(summarize([write_run(tmp_path, "exp", jobs)], fmt="json"))
    assert doc["baseline"] == "slow"
    assert {r["config"]: r["speedup"] for r in doc["rows"]} == {"fast": 4.0, "slow": 1.0, "mid": 2.0}
    assert "samples/s" in doc["speedup"]


def test_speedup_divides_throughput_not_time_of_unequal_work(tmp_path: Path) -> None:
    """A compiled job times fewer batches (its compiling ones are apart): its train time is not
    comparable with the baseline's, its samples/s is."""
    jobs = [
        FakeJob("eager", engine="torch", train_s=100.0, samples_per_s=100.0),
        FakeJob("compiled", engine="torch", compile=True, train_s=90.0, samples_per_s=300.0),
    ]
    run = write_run(tmp_path, "exp", jobs)
    doc = json.loads(summarize([run], fmt="json", baseline="eager"))
    assert {r["config"]: r["speedup"] for r in doc["rows"]} == {"eager": 1.0, "compiled": 3.0}
    markdown = summarize([run], fmt="markdown", baseline="eager")
    assert "3.00×" in markdown and markdown.startswith("speed-up: samples/s ÷ the baseline's samples/s")
    assert "speed-up: samples/s ÷ the baseline's samples/s" in summarize([run], baseline="eager")


def test_named_baseline(tmp_path: Path) -> None:
    run = write_run(tmp_path, "exp", CONFIGS)
    doc = json.loads(summarize([run], fmt="json", baseline="engine-lightning"))
    assert doc["baseline"] == "engine-lightning"
    assert {r["config"]: r["speedup"] for r in doc["rows"]}["engine-torch"] == pytest.approx(0.5)
    assert json.loads(summarize([run], fmt="json", baseline="fabric"))["baseline"] == "engine-fabric"


@pytest.mark.parametrize(
    ("name", "message"),
    [("nope", "matches no configuration: choose one of engine-torch"), ("engine", "matches 3 configurations")],
)
def test_bad_baseline_is_a_one_line_error(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(JobgenError, match=message):
        summarize([write_run(tmp_path, "exp", CONFIGS)], baseline=name)


def test_baseline_without_time_is_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path, "exp", [*CONFIGS, FakeJob("dead", state="PENDING", result=None)])
    with pytest.raises(JobgenError, match="'dead' has no throughput"):
        summarize([run], baseline="dead")


def test_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(JobgenError, match="unknown format 'xml'"):
        summarize([write_run(tmp_path, "exp", CONFIGS)], fmt="xml")


def test_every_fault_is_a_row_with_its_state_cause_and_hint(tmp_path: Path) -> None:
    jobs = [FakeJob(fid, **{k: v for k, v in vars(job).items() if k != "name"}) for fid, job, *_ in FAULTS]
    # A run has one backend: the local backend's fault goes in a run of its own.
    local = [j for j in jobs if "local.out" in (j.logs or {})]
    runs = [
        write_run(tmp_path, "exp", [FakeJob("fine"), *[j for j in jobs if j not in local]]),
        write_run(tmp_path, "exp", local, run_id="20261129-200000-cd34"),
    ]
    for fmt in ("json", "csv"):
        text = summarize(runs, fmt=fmt)
        rows = json.loads(text)["rows"] if fmt == "json" else list(_rows(text).values())
        by_name = {r["config"]: r for r in rows}
        assert by_name["fine"]["state"] == "COMPLETED" and not by_name["fine"]["problem"]
        for fid, _, state, problem, kind in FAULTS:
            row = by_name[fid]
            assert row["state"] == state.value and problem in row["problem"], fid
            assert bool(row["hint"]) == (kind is not None), fid
            assert not row["train_s"] and not row["speedup"], fid
    table = summarize(runs, width=300)
    for fid, _, state, _, kind in FAULTS:
        line = next(ln for ln in table.splitlines() if ln.startswith(fid + " "))
        assert state.value in line
        if kind:  # the full cause and what to do follow the table
            assert any(ln.startswith(f"• {fid}: ") and " -> " in ln for ln in table.splitlines()), fid


def test_broken_manifest_does_not_hide_the_other_runs(tmp_path: Path) -> None:
    good = write_run(tmp_path, "exp", CONFIGS, run_id="good")
    bad = tmp_path / "exp" / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"schema": 1, "jobs": [')
    text = summarize([good, bad], fmt="csv")
    assert "manifest.json unreadable" in text and "engine-torch" in text


def test_plot_draws_both_charts(tmp_path: Path) -> None:
    from jobgen.results.collect import collect
    from jobgen.results.plot import draw_plot
    from jobgen.results.summary import build_lines

    run = write_run(tmp_path, "exp", [*CONFIGS, FakeJob("dead", result=None, state="CANCELLED")])
    path = tmp_path / "out" / "summary.png"
    summarize([run], plot=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = draw_plot(build_lines(collect([run])), tmp_path / "again.png")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Training time", "Test accuracy", "CPU-hours vs test accuracy"]
    time_ax, acc_ax, _ = fig.axes
    assert [round(p.get_width() * 60, 6) for p in time_ax.patches] == [j.train_s for j in CONFIGS] + [0.0]
    assert [round(p.get_width() / 100, 6) for p in acc_ax.patches] == [j.test_acc for j in CONFIGS] + [0.0]
    assert "CANCELLED" in [t.get_text() for t in acc_ax.texts]


def test_plot_picks_seconds_for_short_jobs_and_starts_bars_at_zero(tmp_path: Path) -> None:
    from jobgen.results.collect import collect
    from jobgen.results.plot import draw_plot
    from jobgen.results.summary import build_lines

    short = [FakeJob("a", {"x": 1}, train_s=2.5, test_acc=0.991), FakeJob("b", {"x": 2}, train_s=4.0, test_acc=0.998)]
    fig = draw_plot(build_lines(collect([write_run(tmp_path, "exp", short)])), tmp_path / "short.png")
    time_ax, acc_ax, _ = fig.axes
    assert time_ax.get_xlabel() == "training time (s)"
    assert [p.get_width() for p in time_ax.patches] == [2.5, 4.0]
    assert [t.get_text() for t in time_ax.texts] == ["2.5", "4.0"]  # not "0.0" minutes
    # A bar's length is its value: the axis starts at 0, the numbers are written on the bars.
    assert acc_ax.get_xlim() == (0, 100) and time_ax.get_xlim()[0] == 0
    assert [t.get_text() for t in acc_ax.texts] == ["99.1", "99.8"]


def test_plot_marks_spread_only_where_there_is_one_and_charts_cost(tmp_path: Path) -> None:
    """Error ticks only on configurations run more than once; the cost chart's labels never overlap."""
    from matplotlib.container import ErrorbarContainer

    from jobgen.results.collect import collect
    from jobgen.results.plot import draw_plot
    from jobgen.results.summary import build_lines

    gpus = {"nodes": 1, "gpus_per_node": 2, "ntasks_per_node": 2, "cpus_per_task": 4, "time": "01:00:00"}
    seeded = [
        FakeJob(
            f"s{seed}",
            {"train.lr": 1, "train.seed": seed},
            train_s=90.0 + 10 * seed,
            test_acc=0.90 + 0.01 * seed,
            slurm=gpus,
            ran_s=600,
        )
        for seed in range(3)
    ]
    # Six single runs whose cost and accuracy nearly coincide.
    close = [
        FakeJob(f"lr-{n}", {"train.lr": 10 + n}, test_acc=0.93, slurm=gpus, ran_s=900 + n, train_s=100.0)
        for n in range(6)
    ]
    lines = build_lines(collect([write_run(tmp_path, "exp", [*seeded, *close])]))
    assert [ln.n for ln in lines] == [3, 1, 1, 1, 1, 1, 1]
    fig = draw_plot(lines, tmp_path / "p.png")
    time_ax, acc_ax, cost_ax = fig.axes
    for ax in (time_ax, acc_ax):
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 1  # one errorbar set ...
        segments = bars[0].lines[2][0].get_segments()
        assert len(segments) == 1 and segments[0][0][1] == segments[0][1][1] == 0  # ... on the seeded bar only
    assert cost_ax.get_title() == "GPU-hours vs test accuracy"
    assert len(cost_ax.collections[0].get_offsets()) == len(lines)
    labels = [t for t in cost_ax.texts if t.get_text() in {ln.label for ln in lines}]
    assert sorted(t.get_text() for t in labels) == sorted(ln.label for ln in lines)
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in labels]
    dots = cost_ax.transData.transform(cost_ax.collections[0].get_offsets())
    for i, box in enumerate(boxes):
        assert all(not box.overlaps(other) for other in boxes[i + 1 :]), labels[i].get_text()
        assert not any(box.x0 < x + 3 < box.x1 + 6 and box.y0 < y + 3 < box.y1 + 6 for x, y in dots)


def test_plot_of_long_jobs_is_in_minutes(tmp_path: Path) -> None:
    from jobgen.results.collect import collect
    from jobgen.results.plot import draw_plot
    from jobgen.results.summary import build_lines

    fig = draw_plot(build_lines(collect([write_run(tmp_path, "exp", CONFIGS)])), tmp_path / "long.png")
    assert fig.axes[0].get_xlabel() == "training time (min)"


def test_a_table_of_many_jobs_has_a_line_each_in_order_and_the_totals_last(tmp_path: Path) -> None:
    jobs = [FakeJob(f"j{i}", train_s=100.0 + i) for i in range(301)]
    text = summarize([write_run(tmp_path, "exp", jobs)], width=400)
    lines = text.splitlines()
    assert lines[0].startswith("speed-up: samples/s ÷") and len(lines) == len(jobs) + 6  # two header lines
    empty = ["MFU (%)", "GPU-h", "CPU-h", "energy (kWh)", "time used (%)", "predictions"]
    shown = lines[1] + " " + lines[2]
    assert all(part in shown for h in HEADERS if h not in empty for part in TERMINAL_HEADERS.get(h, h).split("\n"))
    assert not any(h in shown for h in empty)
    assert set(lines[3]) == {"─"} and len(lines[3]) >= max(len(line) for line in lines[4:-2])
    assert [line.split()[0] for line in lines[4:-2]] == [job.name for job in jobs]
    assert "COMPLETED" in lines[4] and "baseline" in lines[4]
    assert lines[-2] == f"no job has a value in: {', '.join(empty)}"
    assert lines[-1].startswith(f"total of {len(jobs)} jobs: ")


def test_color_marks_the_header_the_baseline_and_each_state(tmp_path: Path) -> None:
    from jobgen.results.collect import collect
    from jobgen.results.summary import apply_baseline, build_lines, render_table

    lines = build_lines(
        collect([write_run(tmp_path, "exp", [FakeJob("a"), FakeJob("b", state="FAILED", result=None)])])
    )
    lines.append(dataclasses.replace(lines[1], label="c", state="STOPPED@1"))  # halving's end: not a failure
    lines.append(dataclasses.replace(lines[1], label="d", state="PAUSED@1"))
    apply_baseline(lines, None)
    plain = render_table(lines, color=False, width=400)
    colored = render_table(lines, color=True, width=400)
    assert "\x1b[" not in plain
    assert re.sub("\x1b\\[[0-9;]*m", "", colored) == plain  # the same table, only marked
    rows = colored.splitlines()
    assert rows[2].startswith("\x1b[1mconfig")  # the header, bold
    a_row = next(r for r in rows if "a " in r[:8])
    b_row = next(r for r in rows if "b " in r[:8])
    assert a_row.startswith("\x1b[1m") and "\x1b[32mCOMPLETED" in a_row  # the baseline, bold; green
    assert not b_row.startswith("\x1b[1m") and "\x1b[31mFAILED" in b_row
    c_row = next(r for r in rows if r.startswith("c "))
    d_row = next(r for r in rows if r.startswith("d "))
    assert " STOPPED@1 " in c_row and "\x1b" not in c_row  # plain, as a dry run: an end chosen
    assert "\x1b[33mPAUSED@1" in d_row  # yellow, as a pending job: a promotion may resume it


def test_empty_run(tmp_path: Path) -> None:
    assert summarize([write_run(tmp_path, "exp", [])]) == "No jobs found.\n"


def test_importing_the_cli_and_summary_stays_light() -> None:
    code = (
        "import sys, jobgen.cli, jobgen.results.summary, jobgen.results.collect; "
        "heavy = {'matplotlib', 'torch'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_a_split_scored_on_other_than_its_size_is_a_problem(tmp_path: Path) -> None:
    """result.json says how many rows each split was scored on; a count that is not the split's size
    (repeated samples, one rank's metrics) is shown, because that accuracy is not the split's."""
    run = write_run(tmp_path, "exp", [FakeJob("good"), FakeJob("repeats")])
    for name, scored in (
        ("good", {"validation": 5000, "test": 10000}),
        ("repeats", {"validation": 5000, "test": 10192}),
    ):
        path = run / "jobs" / name / "result.json"
        result = json.loads(path.read_text())
        path.write_text(
            json.dumps({**result, "samples": {"train": 35000, "validation": 5000, "test": 10000}, "scored": scored})
        )
    doc = json.loads(summarize([run], fmt="json"))
    problems = {r["config"]: r["problem"] for r in doc["rows"]}
    assert problems["good"] is None
    assert problems["repeats"] == "test scored on 10,192 rows of 10,000: its accuracy is not the split's"
    assert "test scored on 10,192 rows of 10,000" in summarize([run])


def test_a_duration_reads_back_to_the_seconds_it_shows() -> None:
    """For every duration: the cell parses back to within its own rounding, and never shows a seconds
    or minutes field of 60 (59.96 s is 1m00s, not "60.0s"; 3599.6 s is 1h00m, not "60m00s")."""
    import re

    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.floats(min_value=0, max_value=10 * 86400, allow_nan=False))
    def check(seconds: float) -> None:
        shown = duration(seconds)
        if m := re.fullmatch(r"(\d+\.\d)s", shown):
            value, step = float(m.group(1)), 0.05
            assert value < 60
        elif m := re.fullmatch(r"(\d+)m(\d\d)s", shown):
            assert int(m.group(2)) < 60 and int(m.group(1)) < 60
            value, step = int(m.group(1)) * 60 + int(m.group(2)), 0.5
        else:
            m = re.fullmatch(r"(\d+)h(\d\d)m", shown)
            assert m and int(m.group(2)) < 60, shown
            value, step = int(m.group(1)) * 3600 + int(m.group(2)) * 60, 30
        assert abs(value - seconds) <= step + 1e-9, (seconds, shown)

    check()


def test_queue_wait_shows_no_tenths_it_cannot_know() -> None:
    """Submit and start times are recorded to the second: the queue wait is whole seconds."""
    assert [whole_seconds(s) for s in (0.0, 0.4, 12.5, 59.4, 59.6, 125.0)] == [
        "0s",
        "0s",
        "12s",
        "59s",
        "1m00s",
        "2m05s",
    ]


def test_a_cpu_job_says_its_devices_are_cpu_processes(tmp_path: Path) -> None:
    """nodes×GPUs of a job that ran on CPU is not "1×2": it had no GPU. The column says cpu."""
    run = write_run(tmp_path, "exp", [FakeJob("on-gpu"), FakeJob("on-cpu", peak_gpu_mb=None)])
    table = summarize([run], width=400)
    cpu = next(ln for ln in table.splitlines() if ln.startswith("on-cpu "))
    gpu = next(ln for ln in table.splitlines() if ln.startswith("on-gpu "))
    assert " 1×2 cpu " in cpu and " 1×2 " in gpu and "cpu" not in gpu
    rows = {r["config"]: r for r in json.loads(summarize([run], fmt="json"))["rows"]}
    assert (rows["on-cpu"]["accelerator"], rows["on-gpu"]["accelerator"]) == ("cpu", "gpu")


SWEPT = (
    st.integers()
    | st.floats()
    | st.booleans()
    | st.none()
    | st.text(max_size=4)
    | st.lists(st.integers(-2, 2), max_size=2)
    | st.sampled_from([1, 1.0, True, "1", "1.0", "true", [1], 0, -0.0, 0.0, False, "0"])
)


@given(SWEPT, SWEPT)
def test_one_configuration_is_one_set_of_swept_values_told_apart_by_type(a: object, b: object) -> None:
    """Two jobs are one configuration when their swept values (seeds aside) are the same JSON values of
    the same kinds: 1, 1.0, true and "1" are four configurations; seeds do not part them."""

    def as_json(value: object) -> object:
        return ("str", value) if type(value) is str else json.dumps(value)

    def key(value: object, seed: int) -> tuple:
        return config_key(SimpleNamespace(experiment="exp", setup=(), sweep={"train.lr": value, "train.seed": seed}))

    assert (key(a, 1) == key(b, 2)) == (as_json(a) == as_json(b))


def test_a_line_of_one_job_says_what_a_line_of_its_copies_says(tmp_path: Path) -> None:
    """A line of one job is made the short way (nothing to combine): it says what the general way says
    of two copies of that job, but for their count and spread."""
    from jobgen.record.model import Run
    from jobgen.results.collect import collect
    from jobgen.results.summary import _line

    jobs = [
        FakeJob("on-gpu", {"train.lr": 1}, state="COMPLETED"),
        FakeJob("on-cpu", {"train.lr": 2}, state="COMPLETED", peak_gpu_mb=None),
        FakeJob("failed", {"train.lr": 3}, state="FAILED", result=None, logs={"slurm-7.out": "CUDA out of memory\n"}),
        FakeJob("queued", {"train.lr": 4}, state="PENDING", result=None),
    ]
    run = write_run(tmp_path, "exp", jobs)
    retried = run / "jobs" / "on-cpu" / "retries.json"
    retried.write_text(json.dumps({"schema": 1, "retries": 2, "limit": 3, "excluded": ["n9", "n2", "n9"]}))
    rows = collect([Run.load(run)])
    for row in rows:
        one, two = _line([row], True, True), _line([row, row], True, True)
        assert one.n == 1 and two.n == 2
        for name in ("label", "run", "config", "state", "mem_kind", "problem", "hint", "detail", "excluded"):
            assert getattr(one, name) == getattr(two, name), (row.name, name)
        assert {k: v.mean for k, v in one.metrics.items()} == pytest.approx({k: v.mean for k, v in two.metrics.items()})
    lines = {ln.label: ln for ln in (_line([row], False, False) for row in rows)}
    assert lines["on-gpu"].mem_kind == "gpu" and lines["on-cpu"].mem_kind == "host"
    assert lines["on-cpu"].excluded == ("n2", "n9") and "retried away from n2, n9" in lines["on-cpu"].detail


@pytest.mark.parametrize("columns", [100, 200])
def test_the_local_demos_summary_has_no_blank_table(runner, tmp_path: Path, monkeypatch, columns: int) -> None:
    """A run like the local demo's (four engines on one CPU, local backend: nothing accounted) shows every
    number it has, and one line, not a table of blanks, for the columns no job has a value in."""
    engines = ("torch", "lightning", "fabric", "hf_trainer")
    jobs = [
        FakeJob(
            f"engine-{e}",
            {"train.engine": e},
            state="COMPLETED",
            engine=e,
            strategy="auto",
            precision="32-true",
            devices=1,
            peak_gpu_mb=None,
            train_s=100.0 + i,
            test_acc=0.80 + i / 100,
            logs={"local.out": "ok\n"},
        )
        for i, e in enumerate(engines)
    ]
    run = write_run(tmp_path, "local_demo", jobs)
    monkeypatch.setenv("COLUMNS", str(columns))
    result = runner.invoke(main, ["--output-root", str(tmp_path), "summary", str(run)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    empty = ["MFU (%)", "GPU-h", "CPU-h", "energy (kWh)", "time used (%)", "predictions"]
    assert f"\nno job has a value in: {', '.join(empty)}\n" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("engine-")]
    headers = [ln for ln in text.splitlines() if ln.startswith("config ")]
    for header in headers:  # each table's header line: none is of a column with nothing in it
        assert not any(word in header for word in ("GPU-h", "CPU-h", "MFU", "energy", "used"))
    assert all(len(row.split()) > 1 for row in rows)  # no row of a table is its label alone
    assert len(rows) == len(headers) * len(engines)
    for i, engine in enumerate(engines):
        shown = " ".join(row for row in rows if row.split()[0] == f"engine-{engine}")
        for value in (
            engine,
            "auto",
            "32-true",
            "1×1 cpu",
            "COMPLETED",
            duration(100.0 + i),
            f"{80 + i:.1f}",
            "2,000 host",
        ):
            assert value in shown, (value, shown)
    assert "baseline" in text and "total of 4 jobs: GPU-h, CPU-h and energy unknown" in text


def test_json_rows_carry_the_parameter_counts_a_lora_job_trained(tmp_path: Path) -> None:
    """parameters.trainable of result.json reaches the rows; jobs of one line that disagree give none."""
    jobs = [
        FakeJob("lora", {"train.peft": "lora"}, parameters=1_000_000, trainable=33_000),
        FakeJob("full", {"train.peft": "none"}, parameters=1_000_000, trainable=1_000_000),
        FakeJob("old", {"train.peft": "old"}, parameters=1_000_000),  # written before parameters.trainable
    ]
    rows = {r["config"]: r for r in json.loads(summarize([write_run(tmp_path, "exp", jobs)], fmt="json"))["rows"]}
    assert rows["lora"]["parameters"] == {"total": 1_000_000, "trainable": 33_000}
    assert rows["full"]["parameters"] == {"total": 1_000_000, "trainable": 1_000_000}
    assert rows["old"]["parameters"] == {"total": 1_000_000, "trainable": None}
    assert "parameters" in FIELDS
