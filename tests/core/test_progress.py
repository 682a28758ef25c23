"""The job log's output layer in-process: the one progress format (training/progress.py), which jobgen
reads back; the heartbeat and rank 0's voice (training/console.py); the libraries' known noise dropped
by its exact text while other warnings and notices still show. The real runs of every engine are
checked in tests/training/test_resume.py (tests/training/logcheck.py)."""

from __future__ import annotations

import ast
import gc
import logging
import time
import warnings
import weakref
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.record.model import RunJob
from jobgen.results import logs
from jobgen.results.diagnose import LAST_LINE, find_cause
from jobgen.results.state_rule import progress as status_column
from jobgen.states import State
from training import console, progress


@given(
    epochs=st.integers(1, 10**6),
    data=st.data(),
    steps=st.integers(0, 10**9),
    loss=st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)),
    loss_batches=st.integers(0, 10**6),
    rate=st.one_of(st.none(), st.floats(0, 1e9, allow_nan=False)),
)
def test_every_progress_line_parses_back_to_what_it_says(epochs, data, steps, loss, loss_batches, rate) -> None:
    epoch = data.draw(st.integers(0, epochs - 1))
    batches = data.draw(st.integers(1, 10**6))
    batch = data.draw(st.integers(0, batches))
    step = data.draw(st.integers(0, steps))
    text = progress.progress_line(
        epoch=epoch,
        epochs=epochs,
        batch=batch,
        batches=batches,
        step=step,
        steps=steps,
        loss=loss,
        loss_batches=loss_batches,
        samples_per_s=rate,
    )
    parsed = progress.parse(text)
    assert parsed is not None, text
    assert (parsed.epoch, parsed.epochs, parsed.step, parsed.steps) == (epoch + 1, epochs, step, steps)
    assert parsed.percent == 100 * batch // batches
    shown_loss = loss is not None and loss_batches > 0
    assert (parsed.loss is not None) == shown_loss
    if shown_loss:
        assert parsed.loss == pytest.approx(loss, abs=5e-5) and f"(mean of {loss_batches} batch" in text
    assert (parsed.samples_per_s is not None) == (rate is not None)
    if rate is not None:  # never a bare number: its window is said beside it
        # One decimal is printed: half a unit of it at most (1.25 prints as "1.2", round half to even),
        # and a hair over for the float subtraction that measures it.
        assert parsed.samples_per_s == pytest.approx(rate, abs=0.05 + 1e-9) and "(timing window so far)" in text
    assert progress.is_progress(text) and progress.is_progress(f"  {text}  ")
    assert progress.EPOCH_LINE.match(text) is None


def test_the_status_column_says_what_the_log_line_says(tmp_path: Path) -> None:
    """`jobgen status` reads progress.json; the log's progress line for the same place starts with the
    same words: one contract, so a user who sees one recognises the other."""
    (tmp_path / "jobs" / "a").mkdir(parents=True)
    (tmp_path / "jobs" / "a" / progress.PROGRESS_FILE).write_text(
        '{"epoch": 1, "epochs": 3, "batch": 45, "batches": 100, "step": 145, "updated_at": "x"}'
    )
    job = RunJob.from_entry(tmp_path, {"name": "a", "state": "RUNNING"})
    job.state = State.RUNNING
    line = progress.progress_line(epoch=1, epochs=3, batch=45, batches=100, step=145, steps=300)
    assert status_column(job) == "epoch 2/3 45%"
    assert line == "training: epoch 2/3 45% step 145/300"


def test_other_lines_are_not_progress() -> None:
    for text in (
        "training: epoch 2/3 validation acc 0.9100 (300 rows)",
        "training: wrote /x/result.json",
        "Epoch 1/1  ━━━━━━━━ 13/13 0:00:01 • 0:00:00 9.61it/s",
        "epoch 0: 100%|██████████| 13/13 [00:00<00:00, 17.08it/s]",
        "{'loss': '0.6962', 'epoch': '0.7692'}",
        "RuntimeError: training: epoch 2/3 45% step 1/2",
    ):
        assert progress.parse(text) is None and not progress.is_progress(text), text
    val = {"acc": 0.91, "f1": None, "scored": 300, "metrics": {"accuracy": 0.91, "mcc": 0.8}}
    assert progress.EPOCH_LINE.match(progress.epoch_line("validation", val, epoch=1, epochs=3))
    test = {"acc": 0.94, "f1": 0.95, "scored": 400, "metrics": {"accuracy": 0.94, "f1": 0.95, "mcc": 0.8}}
    line = progress.epoch_line("test", test, note="weights of epoch 2", primary="mcc")
    assert line == "training: test acc 0.9400 f1 0.9500 mcc 0.8000 (400 rows, weights of epoch 2)"
    assert progress.EPOCH_LINE.match(line)
    stsb = {"acc": None, "f1": None, "scored": 7, "metrics": {"pearson": 0.5, "spearman": None, "mse": 1.0}}
    line = progress.epoch_line("test_validation_mismatched", stsb, primary="pearson")
    assert line == "training: test validation_mismatched pearson 0.5000 (7 rows)"
    assert progress.EPOCH_LINE.match(line)
    assert progress.is_progress(progress.heartbeat_line("validating epoch 2/3", 12.7))
    assert progress.heartbeat_line("preparing data", 12.7) == "training: preparing data, 12 s so far"


def test_the_heartbeat_is_10_s_unless_the_environment_says_otherwise() -> None:
    assert progress.heartbeat_s({}) == progress.HEARTBEAT_S == 10.0
    assert progress.heartbeat_s({progress.HEARTBEAT_ENV: "1"}) == 1.0
    for bad in ("", "x", "0", "-3", "nan", "1e9"):
        assert progress.heartbeat_s({progress.HEARTBEAT_ENV: bad}) == 10.0, bad


class Counters:
    """What a Tracker reads: the run's Stats and TrainClock."""

    times_s = {"train": 2.0}
    timed_samples = 100
    local = {"timed_samples": 50}


class Said:
    """Every line printed so far in this test (pytest's capsys, read as it goes)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys, self.lines = capsys, []

    def __call__(self) -> list[str]:
        self.lines += self.capsys.readouterr().out.splitlines()
        return list(self.lines)


@pytest.fixture
def said(capsys: pytest.CaptureFixture[str]):
    yield Said(capsys)
    console.stop()


def test_rank_0_gets_a_heartbeat_in_every_phase_and_other_ranks_stay_quiet(said: Said) -> None:
    console.start(0, interval=0.3)
    console.phase("preparing data")
    time.sleep(1.0)
    lines = said()
    assert 2 <= len(lines) <= 5 and all(progress.HEARTBEAT_LINE.match(t) for t in lines), lines
    assert lines[0].startswith("training: preparing data, ")

    tracker = console.Tracker(Counters(), Counters(), epochs=2, batches=10, steps=20, world=2)
    tracker.at(0, 0, 0)
    console.training(tracker)
    tracker.batch_done(0, 1, 1, 0.5)  # the first batch is always said
    time.sleep(0.7)
    training = said()[len(lines) :]
    assert training[0] == (
        "training: epoch 1/2 10% step 1/20 loss 0.5000 (mean of 1 batch) samples/s 100.0 (timing window so far)"
    )
    # While training, the heartbeat is the progress line; the loss window restarts after each line.
    assert len(training) >= 2 and all(progress.parse(t) for t in training), training
    assert progress.parse(training[1]).loss is None

    console.set_rank(1)  # the engine says this process is rank 1: it goes quiet
    before = len(said())
    console.say("training: anything")
    tracker.batch_done(0, 10, 2, 0.5)
    time.sleep(0.5)
    assert len(said()) == before

    console.start(1, interval=0.2)  # a rank other than 0 from the start: no heartbeat at all
    time.sleep(0.5)
    assert len(said()) == before


def test_the_heartbeat_holds_no_tracker_once_training_stops(said: Said) -> None:
    """A tracker reaches the whole job through its clock (the model, and with it the process group):
    once training stops, the heartbeat thread must not keep it alive while it waits, or the group
    outlives destroy_process_group() and its threads run into the interpreter's exit (issue 20)."""

    console.start(0, interval=0.3)
    tracker = console.Tracker(Counters(), Counters(), epochs=1, batches=10, steps=10, world=1)
    tracker.at(0, 0, 0)
    console.training(tracker)
    deadline = time.monotonic() + 10  # nothing said: the heartbeat says the progress line from the tracker
    while not any(progress.parse(line) for line in said()):
        assert time.monotonic() < deadline, said()
        time.sleep(0.05)
    console.phase("ending")
    console.say("training: wrote result.json")  # the heartbeat is not due again for a while
    gone = weakref.ref(tracker)
    del tracker
    gc.collect()
    assert gone() is None


def test_the_first_heartbeat_counts_the_silence_from_the_process_start(said: Said) -> None:
    """What was imported before the console could speak (torch, for the device check) counts: the first
    heartbeat is due the interval's margin after the process' start, not after the console's."""
    console.start(0, interval=2.0, since=time.monotonic() - 1.2)  # due 1.4 s after `since`
    time.sleep(0.6)
    lines = said()
    assert len(lines) == 1 and lines[0] == "training: starting, 1 s so far", lines
    console.start(0, interval=2.0)  # without `since`: the silence begins now, nothing is due yet
    time.sleep(0.6)
    assert said() == lines


class Writes:
    """A stream that keeps each write() call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_line_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat thread writes between any two writes of another line: print() writes a line and
    its newline apart, and a CI log once read "...exiting for a manual restarttraining: ending, 0 s so far"."""
    out, err = Writes(), Writes()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(console.CONSOLE, "rank", 0)
    console.say("training: a")
    console.line("training: b", err=True)
    console.line("training: c")
    assert out.calls == ["training: a\n", "training: c\n"] and err.calls == ["training: b\n"]


def test_the_training_process_prints_only_through_the_console() -> None:
    """Every line of the training process goes through training/console.py (say, line), one write under
    its lock; training/relay.py is a process of its own, with no heartbeat."""
    root = Path(console.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "relay.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert found == []


def test_known_noise_is_dropped_by_its_text_and_the_rest_still_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("DS_ACCELERATOR", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(key, "")  # recorded, so that what quiet_libraries sets is undone after the test
        monkeypatch.delenv(key)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            console.quiet_libraries(on_cpu=True)
            for text in ("GPU available: False, used: False", "TPU available: False, using: 0 TPU cores"):
                logger.info(text)
            logger.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
            logger.info("Restoring states from the checkpoint path at /x/last.ckpt")  # news: kept
            logger.warning("GPU memory is low")  # not a known line: kept
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
            warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
            warnings.warn("Checkpoint directory /x exists and is not empty.", UserWarning, stacklevel=1)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen == ["Restoring states from the checkpoint path at /x/last.ckpt", "GPU memory is low"]
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
    import os

    assert os.environ["DS_ACCELERATOR"] == "cpu" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.delenv("DS_ACCELERATOR")
    console.quiet_libraries(on_cpu=False)  # a GPU job: DeepSpeed picks its accelerator itself
    assert "DS_ACCELERATOR" not in os.environ


def test_a_failed_jobs_last_line_is_its_last_word_not_its_progress(tmp_path: Path) -> None:
    """jobgen's diagnosis reads the same format back: heartbeats and progress lines say where a job
    was, so the cause shown is the last other line (or the progress, when there is nothing else)."""
    error = "training: the dataset has no column 'label'"
    beat = progress.heartbeat_line("ending", 3)
    line = progress.progress_line(epoch=0, epochs=2, batch=5, batches=10, step=5, steps=20)
    (tmp_path / "slurm-1.out").write_text(f"training: data ready\n{error}\n{line}\n{beat}\n")
    cause = find_cause(logs.files("sbatch", tmp_path), tmp_path)
    assert cause is not None and (cause.kind, cause.message) == (LAST_LINE, error)
    (tmp_path / "slurm-1.out").write_text(f"{line}\n{beat}\n")
    cause = find_cause(logs.files("sbatch", tmp_path), tmp_path)
    assert cause is not None and cause.message == beat
