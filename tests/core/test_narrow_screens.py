"""Every reading command on a narrow screen: what it prints at 60, 80 and 120 columns holds every word
it prints at 1,000, whole. A table may fold into several, a note may move under it; no token is split
over two lines, and none is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.cli import main
from tests.data.summary.synth import FakeJob, write_run

JOBS = [
    FakeJob("engine-torch", engine="torch", strategy="auto", state="COMPLETED", train_s=59.96),
    FakeJob("engine-lightning-with-a-long-name", sweep={"train.lr": 3e-5}, state="COMPLETED", samples_per_s=12345.6),
    FakeJob("broken", state="FAILED", result=None, error="sbatch: error: Batch job submission failed: Invalid account"),
]
COMMANDS = [
    ["summary", "{run}"],
    ["summary", "{run}", "--format", "markdown"],
    ["status", "{run}"],
    ["runs"],
    ["schema"],
]


# Rules under table headers are as wide as their table; the note column gives way to the notes printed
# in full under the tables (each "• ..."), so its header is the one word a narrow table drops.
NOT_WORDS = {"note"}


def _tokens(text: str) -> set[str]:
    words = {token for line in text.splitlines() for token in line.split()}
    return {w for w in words if w not in NOT_WORDS and set(w) - set("─-|:")}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:3]).replace("{run}", "RUN"))
def test_no_token_is_split_or_lost_on_a_narrow_screen(tmp_path: Path, runner, monkeypatch, command) -> None:
    run = write_run(tmp_path, "exp", JOBS)
    # A job retried twice (slurm.retries): status and summary name the nodes it was kept away from.
    retried = {"schema": 1, "retries": 2, "limit": 3, "excluded": ["gpu-a17", "gpu-b03"], "stopped": None}
    (run / "jobs" / "engine-torch" / "retries.json").write_text(json.dumps(retried))
    args = ["--output-root", str(tmp_path), *(a.format(run=run) for a in command)]
    monkeypatch.setenv("COLUMNS", "1000")
    wide = runner.invoke(main, args)
    assert wide.exit_code == 0, wide.output
    for columns in (60, 80, 120):
        monkeypatch.setenv("COLUMNS", str(columns))
        narrow = runner.invoke(main, args)
        assert narrow.exit_code == 0, narrow.output
        lost = _tokens(wide.output) - _tokens(narrow.output)
        assert not lost, (columns, sorted(lost)[:10], narrow.output)
