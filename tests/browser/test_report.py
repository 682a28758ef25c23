"""jobgen report: one self-contained HTML page, read as HTML and rendered in a real headless Chromium."""

from __future__ import annotations

import csv
import io
import os
import re
import time
from collections.abc import Iterator
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlparse
from urllib.request import url2pathname

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.results.charts import PALETTE, nice_ticks, time_unit, zoomed_range
from tests.data.summary.synth import FakeJob, log, write_run

if TYPE_CHECKING:
    from tests.support.browser import Browser

# What the jobs asked Slurm for; with the start and end jobgen recorded, their GPU-hours (no accounting here).
REQUEST = {"nodes": 1, "gpus_per_node": 2, "ntasks_per_node": 2, "cpus_per_task": 4, "time": "01:00:00"}
JOBS = [
    FakeJob(
        "engine-torch",
        {"train.engine": "torch"},
        engine="torch",
        train_s=95.0,
        test_acc=0.912,
        slurm=REQUEST,
        ran_s=180,
        state="COMPLETED",
    ),
    FakeJob(
        "engine-lightning",
        {"train.engine": "lightning"},
        train_s=80.0,
        test_acc=0.934,
        predictions=True,  # train.save_predictions: linked beside the job's logs
        slurm=REQUEST,
        ran_s=150,
        state="COMPLETED",
    ),
    FakeJob(
        "engine-fabric",
        {"train.engine": "fabric"},
        engine="fabric",
        train_s=70.0,
        test_acc=0.921,
        slurm=REQUEST,
        ran_s=120,
        state="COMPLETED",
    ),
    FakeJob("oom", {"train.engine": "fabric"}, result=None, logs={"slurm-4000.out": log("oom.out")}),
]


def _metrics(job_dir: Path, speed: float, top: float, n: int) -> None:
    """metrics.csv in the training's shape: train rows every 10 steps, a validation row per epoch."""
    rows = [("epoch", "step", "split", "loss", "acc", "f1", "lr", "samples_per_s", "time_s")]
    for step in range(10, 201, 10):
        rows.append((step // 100, step, "train", 0.7 / (1 + step / 40) + 0.1 * n, "", "", 1e-3, "", step / speed))
    for epoch, step in enumerate((100, 200)):
        rows.append((epoch, step, "validation", "", top - 0.05 * (1 - epoch), 0.9, "", "", step / speed + 1))
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    (job_dir / "metrics.csv").write_text(buf.getvalue())


def _run(tmp_path: Path) -> Path:
    run = write_run(tmp_path / "runs", "sweep", JOBS)
    for n, job in enumerate(JOBS[:3]):
        _metrics(run / "jobs" / job.name, speed=2.0 + n, top=job.test_acc, n=n)
    (run / "jobs" / "engine-torch" / "slurm-4000.out").write_text("training: done\n")
    return run


class _Page(HTMLParser):
    """The parts of the page a test checks: body rows of the summary table, links, sources, charts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.links: list[str] = []
        self.sources: list[str] = []
        self.tags: list[str] = []
        self._where: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "tbody":
            self._where.append("tbody")
        elif tag == "tr" and self._where:
            self.rows.append([])
        elif tag == "td" and self._where and self.rows:
            self.rows[-1].append("")
        if tag == "a" and a.get("href"):
            self.links.append(a["href"] or "")
        for key in ("src", "srcset", "xlink:href"):
            if a.get(key):
                self.sources.append(a[key] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody" and self._where:
            self._where.pop()

    def handle_data(self, data: str) -> None:
        if self._where and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def _report(tmp_path: Path, runner) -> tuple[Path, Path, str]:
    run = _run(tmp_path)
    out = tmp_path / "share" / "report.html"
    out.parent.mkdir()
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "report", "sweep", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"report: {out}"
    return run, out, out.read_text()


def test_report_has_one_row_per_job_and_loads_nothing(tmp_path: Path, runner) -> None:
    run, out, html = _report(tmp_path, runner)
    page = _Page()
    page.feed(html)
    # The summary may be folded into stacked tables, each with one row per job, led by its config.
    assert len(page.rows) % len(JOBS) == 0
    assert [row[0].strip().lstrip("\u25a0 ") for row in page.rows] == [j.name for j in JOBS] * (
        len(page.rows) // len(JOBS)
    )
    torch_row = [cell for row in page.rows[:: len(JOBS)] for cell in row]
    assert "1m35s" in torch_row and "91.2" in torch_row and "baseline" in torch_row
    # Self-contained: no script, no stylesheet or image from anywhere, links only to the run's own files.
    assert "script" not in page.tags and "link" not in page.tags and page.sources == []
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)
    assert page.links, "no log links"
    for href in page.links:
        assert _target(out, href).is_file(), href
    predictions = [href for href in page.links if href.endswith("/predictions.csv")]
    assert [_target(out, href).parent.name for href in predictions] == ["engine-lightning"]
    assert "<th>predictions</th>" not in html  # linked by name, not spelled out as a column of paths
    assert any(cell.strip() == "accuracy 0.9340" for row in page.rows for cell in row)  # the primary, named
    assert any(href.endswith("engine-torch/slurm-4000.out") for href in page.links)
    # Curves and the time/accuracy and cost/accuracy charts, one coloured line per job that logged metrics.
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart') == 6
    assert f"total of {len(JOBS)} jobs: {2 * (180 + 150 + 120) / 3600:.3f} GPU-h" in html
    assert html.count(f'stroke="{PALETTE[0]}"') == 4 and html.count(f'stroke="{PALETTE[3]}"') == 0
    # The failed job: its cause, the hint, and a link to the log that says so.
    assert "CUDA out of memory" in html and "lower batch_size" in html
    assert any(href.endswith("oom/slurm-4000.out") for href in page.links)


def test_report_lists_each_jobs_logs_once(tmp_path: Path, runner, monkeypatch) -> None:
    """The page links each job's logs and reads the failed job's for its cause: one listing of each
    job's folder for both."""
    import os

    listed: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def listing(real):
        def count(path="."):
            listed.append(Path(path).name)
            return real(path)

        return count

    run = _run(tmp_path)
    past = time.time() - 60  # the jobs ended a minute ago: their folders' stamps tell that nothing changed
    for path in [*run.rglob("*"), run]:
        os.utime(path, (past, past))
    monkeypatch.setattr(os, "scandir", listing(real_scandir))
    monkeypatch.setattr(os, "listdir", listing(real_listdir))
    out = tmp_path / "r.html"
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "report", "sweep", "-o", str(out)])
    assert done.exit_code == 0, done.output
    html = out.read_text()
    assert "CUDA out of memory" in html and "slurm-4000.out" in html
    names = sorted(job.name for job in JOBS)
    assert sorted(name for name in listed if name in names) == names, listed


def test_jobs_that_stopped_the_same_way_are_one_entry_with_one_log_tail(tmp_path: Path, runner) -> None:
    """A sweep whose 30 jobs died on the same line is one entry (30 jobs, the first 12 named, the log of
    the first), not 30 copies of one log tail; a job that died otherwise is an entry of its own. The
    table still has a row for every job."""
    same = "step 3: loss 0.70\nTraceback (most recent call last):\nValueError: bad lr\n"
    jobs = [
        FakeJob(f"j{i:02d}", {"train.lr": str(i)}, result=None, state="FAILED", logs={f"slurm-{4000 + i}.out": same})
        for i in range(30)
    ]
    other = "Traceback (most recent call last):\nKeyError: 'label'\n"
    jobs.append(FakeJob("odd", {"train.lr": "99"}, result=None, state="FAILED", logs={"slurm-5000.out": other}))
    run = write_run(tmp_path / "runs", "many", jobs)
    out = tmp_path / "r.html"
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "report", str(run), "-o", str(out)])
    assert done.exit_code == 0, done.output
    html = out.read_text()
    section = html[html.index("Jobs without a result") :]
    assert section.count("<li>") == 2, section
    assert "<b>30 jobs</b> (j00, j01" in section and "j11 and 18 more; the log below is the first one's)" in section
    assert "j12" not in section and section.count("ValueError: bad lr") == 2  # the cause, and the one tail
    assert section.count("<details>") == 2 and "slurm-4000.out" in section and "slurm-4001.out" not in section
    assert "<b>odd</b> (FAILED): KeyError: &#x27;label&#x27;" in section
    page = _Page()
    page.feed(html)
    assert {row[0].strip().lstrip("\u25a0 ") for row in page.rows} == {job.name for job in jobs}


def test_report_escapes_what_runs_wrote(tmp_path: Path, runner) -> None:
    hostile = FakeJob("x", {"train.engine": "torch"}, engine="<script>alert(1)</script>")
    write_run(tmp_path / "runs", "sweep", [hostile])
    out = tmp_path / "r.html"
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "report", "sweep", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert "<script>" not in out.read_text() and "&lt;script&gt;" in out.read_text()


def test_report_of_an_unknown_run_is_a_one_line_error(tmp_path: Path, runner) -> None:
    done = runner.invoke(main, ["--output-root", str(tmp_path), "report", "nope", "-o", str(tmp_path / "r.html")])
    assert done.exit_code == 1
    assert "nope" in done.output and len(done.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_chart_scales() -> None:
    assert time_unit(59) == (1.0, "s") and time_unit(600) == (60.0, "min") and time_unit(9000) == (3600.0, "h")
    assert nice_ticks(0, 10) == [0, 2.5, 5, 7.5, 10]
    ticks = nice_ticks(91.2, 93.4)
    assert ticks[0] <= 91.2 and ticks[-1] >= 93.4 and len(ticks) <= 7
    low, high = zoomed_range([91.2, 93.4], 0, 100)
    assert 85 < low < 91.2 and 93.4 < high <= 100
    assert zoomed_range([99.9, 100.0], 0, 100)[1] == 100


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for this file's tests (starting one costs seconds); each load sets its width."""
    from tests.support.browser import Browser

    with Browser(width=1280, height=2400) as started:
        yield started


def test_report_renders_in_a_real_browser(tmp_path: Path, runner, browser: Browser) -> None:
    from PIL import Image

    _, out, _ = _report(tmp_path, runner)
    js = {
        "rows": "document.querySelector('table.summary').querySelectorAll('tbody tr').length",
        "charts": "[...document.querySelectorAll('svg.chart')].map(e => {const r = e.getBoundingClientRect();"
        " return [r.left, r.top, r.width, r.height, e.getAttribute('aria-label')]})",
    }
    page = browser.load(out, js, width=1280)
    assert page.errors == []
    assert page.values["rows"] == len(JOBS)
    charts = page.values["charts"]
    assert [c[4] for c in charts] == [
        "Training time vs test accuracy",
        "GPU-hours vs test accuracy",
        "Training loss",
        "Training loss over time",
        "Validation accuracy",
        "Validation accuracy over time",
    ]
    image = Image.open(io.BytesIO(page.screenshot)).convert("RGB")
    assert image.size == (1280, 2400)
    job_colors = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in PALETTE[:3]]
    for left, top, width, height, title in charts:
        assert top + height <= image.size[1], f"{title} is below the screenshot"
        box = image.crop((int(left), int(top), int(left + width), int(top + height)))
        found = {color: n for n, color in box.getcolors(maxcolors=box.width * box.height)}
        counts = {color: found.get(color, 0) for color in job_colors}
        # Each job's line (or dot) is drawn in its colour inside each chart.
        assert all(n >= 20 for n in counts.values()), (title, counts)


def test_the_browser_check_sees_console_errors_and_network_loads(tmp_path: Path, browser: Browser) -> None:
    """The harness above is only worth its silence if it hears a page that misbehaves."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><script src="https://cdn.invalid/chart.js"></script></head>'
        '<body><script>console.error("boom"); undefinedFunction();</script></body></html>'
    )
    page = browser.load(bad, {}, width=400)
    assert any("cdn.invalid" in e for e in page.errors), page.errors
    assert any("boom" in e for e in page.errors) and any("exception" in e for e in page.errors), page.errors


# A sweep whose points nearly coincide: eleven jobs within half a second and 0.02 points of each other
# (some exactly alike), and one far away that stretches both axes, so the eleven are pixels apart.
CLOSE = [
    FakeJob(
        f"lr-{lr}_batch-{batch}",
        {"train.lr": lr, "train.batch_size": batch},
        engine="torch",
        train_s=80.0 + 0.05 * (n // 2) if n < 11 else 160.0,
        samples_per_s=250.0 + n,
        test_acc=0.930 + 0.0001 * (n % 3) if n < 11 else 0.95,
        slurm=REQUEST,
        ran_s=150 + n // 2 if n < 11 else 300,
        state="COMPLETED",
        logs={f"slurm-{4000 + n}.out": "training: done\n"},
    )
    for n, (lr, batch) in enumerate((lr, b) for lr in ("1e-05", "3e-05", "0.0001", "0.0003") for b in (16, 32, 64))
]
SECRET = "hf_" + "Q" * 30
FAILED_LOG = "".join(f"step {n}: loss 0.{n:02d}\n" for n in range(60)) + (
    f"HF_TOKEN={SECRET}\nTraceback (most recent call last):\nRuntimeError: shape <mismatch> & more\n"
)


def test_report_reads_well_at_1000_and_1400_px(tmp_path: Path, runner, monkeypatch, browser: Browser) -> None:
    """Labels of close points never overlap (each other or a dot), the page never scrolls sideways, its
    log links resolve from wherever the page is opened, and a failed job's log tail is in the page."""
    failed = FakeJob("crashed", {"train.lr": "1"}, result=None, state="FAILED", logs={"slurm-4012.out": FAILED_LOG})
    monkeypatch.chdir(tmp_path)  # the runs are named relative to where the command runs
    write_run(Path("runs"), "sweep", [*CLOSE, failed])
    Path("share").mkdir()
    done = runner.invoke(main, ["--output-root", "runs", "report", "sweep", "-o", "share/report.html"])
    assert done.exit_code == 0, done.output
    # The page, mailed: copied to another folder and opened from another working directory.
    moved = tmp_path / "inbox" / "report.html"
    moved.parent.mkdir()
    moved.write_bytes(Path("share/report.html").read_bytes())
    monkeypatch.chdir(moved.parent)
    html = moved.read_text()
    page = _Page()
    page.feed(html)
    assert len(page.links) >= len(CLOSE) + 1
    for href in page.links:
        assert _target(moved, href).is_file(), href
    # The failed job's last 40 lines, escaped, with the secret taken out.
    assert "RuntimeError: shape &lt;mismatch&gt; &amp; more" in html and "step 59: loss" in html
    assert "step 23: loss" in html and "step 22: loss" not in html  # 40 lines: 37 steps and 3 more
    assert SECRET not in html and "HF_TOKEN=[redacted]" in html
    assert "speed-up: samples/s ÷ the baseline's samples/s (lr-1e-05_batch-16, 250.0 samples/s)" in unescape(html)
    js = {
        "scroll": "[document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth,"
        " Math.max(...[...document.body.querySelectorAll('*')].map(e => e.getBoundingClientRect().right))]",
        "charts": "[...document.querySelectorAll('svg.chart')].map(svg => {"
        " const box = e => {const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]};"
        " return {title: svg.getAttribute('aria-label'), points: svg.querySelectorAll('text.point').length,"
        " texts: [...svg.querySelectorAll('text')].map(e => [e.textContent, ...box(e)]),"
        " dots: svg.classList.contains('scatter') ? [...svg.querySelectorAll('circle')].map(box) : []}})",
    }
    for width in (1000, 1400):
        shown = browser.load(moved, js, width=width)
        assert shown.errors == []
        scroll_width, client_width, rightmost = shown.values["scroll"]
        assert scroll_width <= client_width and rightmost <= client_width, (width, shown.values["scroll"])
        charts = shown.values["charts"]
        scatters = [c for c in charts if c["title"].endswith("vs test accuracy")]
        assert [c["points"] for c in scatters] == [len(CLOSE), len(CLOSE)]
        for chart in charts:
            texts = chart["texts"]
            for i, (a, *box_a) in enumerate(texts):
                for b, *box_b in texts[i + 1 :]:
                    assert not _overlap(box_a, box_b), (width, chart["title"], a, b)
                for dot in chart["dots"]:
                    assert not _overlap(box_a, dot), (width, chart["title"], a, dot)


def _target(page: Path, href: str) -> Path:
    """The file a link of the page at `page` opens, resolved the way a browser does."""
    url = urlparse(urljoin(page.resolve().as_uri(), href))
    assert url.scheme == "file", href
    return Path(url2pathname(url.path))


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_a_column_is_as_wide_as_its_widest_mean_or_spread_not_both_in_a_row() -> None:
    """A combined line's cell shows the spread under the mean: the column is measured on each apart."""
    from jobgen.results.report import _column_px

    combined = ["12,345.6 ± 1,234.5", "7.0"]
    assert _column_px("samples/s", combined) == _column_px("samples/s", ["12,345.6", "1,234.5", "7.0"])
    assert _column_px("samples/s", combined) < _column_px("samples/s", ["12,345.6 and 1,234.5"])


def test_a_long_config_label_may_wrap_after_its_separators_only() -> None:
    from jobgen.results.columns import Line
    from jobgen.results.report import _cell

    line = Line(label="x", experiment="e", run="r", config={}, state="COMPLETED", n=1, metrics={}, mem_kind="host")
    html = _cell(line, "config", "r1/lr-0.001_seed=3,a<b", {id(line): "#123456"})
    assert html.endswith("r1/<wbr>lr-0.001_<wbr>seed=<wbr>3,<wbr>a&lt;b</td>"), html


def test_a_columns_width_is_the_same_in_every_process() -> None:
    """Of many texts as long as the longest, the ones measured do not follow the strings' hashes (which
    differ per process): the same run gives the same page, whatever PYTHONHASHSEED."""
    import itertools
    import subprocess
    import sys

    labels = ["".join(chars) for chars in itertools.product("ilmW", repeat=4)][:60]  # 60 widths, one length
    code = (
        "import sys; from jobgen.results.report import _column_px; "
        "print(repr(_column_px('config', sys.argv[1].split(','))))"
    )
    widths = {
        subprocess.run(
            [sys.executable, "-c", code, ",".join(labels)],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3, 4)
    }
    assert len(widths) == 1, widths


@given(
    st.one_of(
        st.from_regex(r"[A-Za-z0-9/_.~-]+", fullmatch=True),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1),
    )
)
def test_a_log_link_is_the_paths_file_uri_escaped_for_html(name: str) -> None:
    """The short way for plain paths gives what Path.as_uri() and html.escape give for every path."""
    from html import escape
    from urllib.parse import quote_from_bytes

    from jobgen.results.report import _href

    path = Path("/runs/exp") / name.lstrip("/")
    assert _href(path) == escape("file://" + quote_from_bytes(os.fsencode(os.path.abspath(path))))
    # Given as text (the report's links are): "//", "/./", "/../" and a trailing "/" left in for abspath.
    for text in (str(path), "/runs/exp/" + name, "/" + name):
        assert _href(text) == escape("file://" + quote_from_bytes(os.fsencode(os.path.abspath(text))))
