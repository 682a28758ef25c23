"""The local demo sweep, run once for the module by the docs' example of jobgen.api
(docs/guides/diff-rerun-api.md; tests/support/api_example.py is the same text): the example runs as
written, and the summary, plot and report of the real four-engine run it made carry what each job's
files say."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobgen.results.summary import FIELDS
from tests.training.conftest import REPO, subprocess_env
from tests.training.logcheck import check_log

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(900)]


class _Demo:
    """The example's output, the output root it wrote its runs to (the demo's and the rerun's), and
    each job log's lines with the time they appeared in the file (the first entry: when it appeared)."""

    def __init__(self, done: subprocess.CompletedProcess, root: Path, logs: dict[Path, list[tuple[float, str]]]):
        self.stdout, self.root, self.logs = done.stdout, root, logs


def _follow(logs: dict[Path, list[tuple[float, str]]], read: dict[Path, int], root: Path) -> None:
    """Append the new whole lines of every job log under `root`, stamped with the time they are seen."""
    now = time.monotonic()
    for log in root.glob("local_demo/*/jobs/*/local.out"):
        if log not in logs:
            logs[log], read[log] = [(now, "<start>")], 0
        data = log.read_bytes()
        end = data.rfind(b"\n") + 1  # whole lines only: a partial last line is read with its end
        for line in data[read[log] : end].split(b"\n")[:-1]:
            logs[log].append((now, line.decode(errors="replace")))
        read[log] = max(read[log], end)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> _Demo:
    root = tmp_path_factory.mktemp("local-demo") / "runs"
    env = subprocess_env({"JOBGEN_OUTPUT_ROOT": str(root)})
    example = REPO / "tests" / "support" / "api_example.py"
    logs: dict[Path, list[tuple[float, str]]] = {}
    read: dict[Path, int] = {}
    with subprocess.Popen(
        [sys.executable, str(example)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(proc.communicate(timeout=850)), daemon=True)
        reader.start()
        while reader.is_alive():
            _follow(logs, read, root)
            reader.join(0.25)
        _follow(logs, read, root)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, *out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return _Demo(done, root, logs)


def _rows(text: str) -> dict[str, dict[str, str]]:
    return {r["config"]: r for r in csv.DictReader(io.StringIO(text))}


def test_the_readme_api_example_runs(demo: _Demo) -> None:
    root = demo.root
    assert "local_demo ['engine-torch', 'engine-lightning', 'engine-fabric', 'engine-hf-trainer']" in demo.stdout
    assert demo.stdout.count("COMPLETED") >= 4
    runs = [json.loads((p / "manifest.json").read_text()) for p in (root / "local_demo").iterdir()]
    assert sorted(len(m["jobs"]) for m in runs) == [1, 4]  # the sweep and the rerun of one of its jobs
    # Each engine's job log, as the demo's user reads it while the job runs: only our lines, none of the
    # libraries' noise, and no silence of over 10 s (the default heartbeat) from its start to its end.
    assert len(demo.logs) == 5
    for log, lines in demo.logs.items():
        assert [text for _, text in lines[1:]] == log.read_text().splitlines(), log  # every line was seen
        assert check_log(lines, max_gap_s=10.0) == [], log


def test_summary_of_a_real_local_sweep(demo: _Demo, tmp_path: Path, runner) -> None:
    """The demo's sweep on sizes that divide by nothing (601/101/151 rows): the summary must not care."""
    from jobgen.cli import main

    root = demo.root
    (run,) = [
        p for p in (root / "local_demo").iterdir() if len(json.loads((p / "manifest.json").read_text())["jobs"]) > 1
    ]
    manifest = json.loads((run / "manifest.json").read_text())
    assert len(manifest["jobs"]) >= 3
    plot = tmp_path / "summary.png"
    outputs = {}
    for fmt in ("table", "csv", "markdown", "json"):
        args = ["--output-root", str(root), "summary", str(run), "--format", fmt]
        done = runner.invoke(main, args + (["--plot", str(plot)] if fmt == "json" else []))
        assert done.exit_code == 0, done.output
        outputs[fmt] = done.stdout  # "plot: FILE" goes to stderr
    rows = json.loads(outputs["json"])["rows"]
    assert len(rows) == len(manifest["jobs"])
    by_csv = _rows(outputs["csv"])
    # A local job holds no allocation (no GPU-, CPU-hours, limit) and a CPU job no MFU: blank, not 0.
    blank = ("mfu", "gpu_hours", "cpu_hours", "energy_kwh", "time_used_fraction", "usage_from")
    # predictions: the demo does not set train.save_predictions; outcome, rung, rung_metric(s): nor halving.
    halving = ("outcome", "rung", "rung_metrics", "rung_metric")
    unfilled = ("problem", "hint", "val_acc_so_far", "excluded_nodes", "predictions", *halving, *blank)
    filled = [f for f in FIELDS if not f.endswith("_std") and f not in unfilled]
    for row in rows:
        result = json.loads((run / "jobs" / row["config"] / "result.json").read_text())
        assert row["state"] == "COMPLETED"
        assert [f for f in filled if row[f] is None or by_csv[row["config"]][f] == ""] == [], row
        assert [f for f in blank if row[f] is not None or by_csv[row["config"]][f] != ""] == [], row
        assert row["train_s"] == pytest.approx(result["times_s"]["train"])
        assert row["test_acc"] == pytest.approx(result["test_acc"])
        assert row["best_val_acc"] == pytest.approx(result["best_val_acc"])
        assert row["samples_per_s"] == pytest.approx(result["throughput"]["samples_per_s"])
        assert row["engine"] == result["engine"]
        assert row["primary_metric"] == result["primary_metric"] == "accuracy"
        assert row["test_primary"] == pytest.approx(result["test_acc"])
        assert row["test_metrics"] == pytest.approx(result["test_metrics"])
        for fmt in ("table", "markdown"):
            assert row["config"] in outputs[fmt] and f"{100 * result['test_acc']:.1f}" in outputs[fmt]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert next(r for r in rows if r["engine"] == "torch")["baseline"] is True
    # The report draws every job's curves from the metrics.csv the engines wrote (time_s included).
    from jobgen.results.charts import PALETTE

    report = tmp_path / "report.html"
    done = runner.invoke(main, ["--output-root", str(root), "report", str(run), "-o", str(report)])
    assert done.exit_code == 0, done.output
    html = report.read_text()
    for color in PALETTE[: len(rows)]:
        assert html.count(f'stroke="{color}"') == 4, color  # loss and accuracy, over steps and over time
