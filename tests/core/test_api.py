"""jobgen.api: the CLI's own code from Python, values returned, errors raised, nothing printed."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from jobgen import api
from jobgen.cli import main
from jobgen.errors import WaitTimeout
from jobgen.results.summary import FIELDS
from jobgen.states import State
from tests.core.test_rerun import EXP, SWEPT, checkout  # noqa: F401  (the stand-in checkout fixture)

REPO = Path(__file__).resolve().parents[2]


def test_load_plan_submit_results_rerun(tmp_path: Path, runner, checkout: Path, capfd):  # noqa: F811
    path = tmp_path / "exp.toml"
    path.write_text(SWEPT)
    root = tmp_path / "runs"
    exp = api.load(path, sets=["train.epochs=2"])
    assert exp.name == "exp" and exp.config.train.epochs == 2
    assert [job.name for job in api.plan(exp)] == ["lr-0.001", "lr-0.002"]
    capfd.readouterr()

    run = api.submit(exp, output_root=root)
    assert capfd.readouterr().out == "", "the API printed"
    assert run.wait(timeout=60) == {"lr-0.001": State.COMPLETED, "lr-0.002": State.COMPLETED}
    assert [(job.name, job.state, job.sweep) for job in run.jobs()] == [
        ("lr-0.001", State.COMPLETED, {"train.lr": 0.001}),
        ("lr-0.002", State.COMPLETED, {"train.lr": 0.002}),
    ]
    rows = run.results()
    assert [list(row) for row in rows] == [FIELDS, FIELDS]
    assert [row["test_acc"] for row in rows] == [0.52, 0.52]
    # The same rows as `jobgen summary --format csv`, value for value.
    shown = runner.invoke(main, ["summary", str(run.path), "--format", "csv"])
    assert shown.exit_code == 0, shown.output
    parsed = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert [[_csv(v) for v in row.values()] for row in rows] == [list(r.values()) for r in parsed]
    table = run.to_pandas()
    assert list(table.columns) == FIELDS and list(table["test_acc"]) == [0.52, 0.52]

    assert api.get_run("exp", output_root=root).path == run.path == api.get_run(run.run_id, output_root=root).path
    again = run.rerun(["lr-0.002"])
    assert again.rerun_of == run.run_id and again.states() == {"lr-0.002": State.COMPLETED}
    assert again.results()[0]["test_acc"] == 0.52
    assert api.get_run(output_root=root).path == again.path  # the latest submitted run
    assert capfd.readouterr().out == ""


def _csv(value: object) -> str:
    """A cell as the CSV writes it: metrics by name as one JSON cell, booleans as JSON writes them."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else ("true" if value else "false") if isinstance(value, bool) else str(value)


def test_wait_gives_up_with_a_timeout_error(tmp_path: Path, runner, monkeypatch: pytest.MonkeyPatch):
    from jobgen.commands.submit import prepare

    path = tmp_path / "exp.toml"
    path.write_text(EXP.replace('backend = "local"', 'backend = "sbatch"'))
    from jobgen.results import state_rule
    from jobgen.states import JobInfo

    run = api.Run(prepare(path, tmp_path / "runs").run_dir)

    def still_pending(runs, refresh=False, meanwhile=None):  # the scheduler's answer, every time it is asked
        if meanwhile is not None:
            meanwhile()()
        for r in runs:
            for job in r.jobs:
                job.recorded, job.live = State.SUBMITTED, JobInfo(State.PENDING)

    monkeypatch.setattr(state_rule, "ask_schedulers", still_pending)
    with pytest.raises(WaitTimeout) as caught:
        run.wait(timeout=0, interval=0.01)
    assert isinstance(caught.value, TimeoutError) and "still running after 0 s" in caught.value.message
    # `jobgen status --watch` waits through the same reading, and gives up the same way.
    shown = runner.invoke(main, ["status", str(run.path), "--watch", "--interval", "0.01", "--timeout", "0"])
    assert shown.exit_code == 1 and shown.output.count("PENDING") == 1, shown.output
    assert shown.output.strip().splitlines()[-1] == caught.value.format_message().join(["Error: ", ""])


def test_the_docs_example_is_the_typed_file():
    """The API example of docs/guides/diff-rerun-api.md is tests/support/api_example.py, which
    scripts/lint.sh types with mypy --strict and tests/training/test_local_demo.py runs."""
    page = (REPO / "docs" / "guides" / "diff-rerun-api.md").read_text()
    block = re.search(r"<!-- api-example:start -->\n```python\n(.*?)```\n<!-- api-example:end -->", page, re.S)
    assert block, "docs/guides/diff-rerun-api.md has no API example between its markers"
    assert block.group(1) == (REPO / "tests" / "support" / "api_example.py").read_text()
    assert "mypy --strict tests/support/api_example.py" in (REPO / "scripts" / "lint.sh").read_text()
