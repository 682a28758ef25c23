"""The training log's progress lines, defined once: every engine writes them (training/console.py) and
jobgen reads them (the status column, the failure diagnosis). Plain Python only: jobgen imports it.

Three kinds of line, all from rank 0, all starting with "training: ":

    training: epoch 2/3 45% step 120/330 loss 0.4123 (mean of 40 batches) samples/s 93.9 (timing window so far)
    training: epoch 2/3 validation acc 0.9100 (300 rows)
    training: preparing data, 12 s so far

- the **progress line**: `epoch` counts from 1, the percentage is of this epoch's batches (the same
  `epoch 2/3 45%` as `jobgen status` shows from progress.json), `step` counts optimizer steps of the
  whole run. Each number says its window: the loss is the mean of the training losses of the batches
  since the previous progress line (absent when there were none); samples/s is the rows of the timed
  batches so far over their time, the timing window of docs/contracts.md that `jobgen summary`'s
  samples/s uses (exactly that number on one rank; with several, rank 0's count times the world size
  until the counters are summed at the end);
- the **epoch line**: the validation (or test) score at the end of an epoch;
- the **heartbeat**: what the job is doing, and for how long, when nothing was printed for
  `heartbeat_s()` seconds (default 10, `JOBGEN_HEARTBEAT_S` overrides); while training, the heartbeat is
  the current progress line instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "training: "
HEARTBEAT_ENV = "JOBGEN_HEARTBEAT_S"
HEARTBEAT_S = 10.0
LOSS_WINDOW = "mean of {n} batch{es}"
RATE_WINDOW = "timing window so far"
# progress.json: rewritten by rank 0 every few seconds (training/results.py); `epoch` counts from 0 there.
PROGRESS_FILE = "progress.json"
PROGRESS_KEYS = ("epoch", "epochs", "batch", "batches")  # integers; also "step" and "updated_at"

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
PROGRESS_LINE = re.compile(
    rf"^{PREFIX}epoch (?P<epoch>\d+)/(?P<epochs>\d+) (?P<percent>\d+)% step (?P<step>\d+)/(?P<steps>\d+)"
    rf"(?: loss (?P<loss>{_NUMBER}) \(mean of (?P<loss_batches>\d+) batch(?:es)?\))?"
    rf"(?: samples/s (?P<samples_per_s>{_NUMBER}) \({RATE_WINDOW}\))?$"
)
EPOCH_LINE = re.compile(
    rf"^{PREFIX}(?:epoch (?P<epoch>\d+)/(?P<epochs>\d+) (?P<split>validation)|(?P<test>test)(?: [\w.-]+)?)"
    rf"(?: acc (?P<acc>{_NUMBER}))?(?: [a-z0-9_]+ \S+)* \(\d+ rows(?:, [^)]*)?\)$"
)
HEARTBEAT_LINE = re.compile(rf"^{PREFIX}(?P<phase>[a-z][\w /.-]*?), (?P<seconds>\d+) s so far$")


def where(epoch: int, epochs: int, batch: int, batches: int) -> str:
    """'epoch 2/3 45%' for the 0-based `epoch` with `batch` of `batches` done: `jobgen status`'s
    progress column and the start of the progress line."""
    return f"epoch {epoch + 1}/{epochs} {100 * batch // max(batches, 1)}%"


def progress_line(
    *,
    epoch: int,
    epochs: int,
    batch: int,
    batches: int,
    step: int,
    steps: int,
    loss: float | None = None,
    loss_batches: int = 0,
    samples_per_s: float | None = None,
) -> str:
    """The progress line (module docstring); `epoch` counts from 0, as in progress.json."""
    text = f"{PREFIX}{where(epoch, epochs, batch, batches)} step {step}/{steps}"
    if loss is not None and loss_batches > 0:
        window = LOSS_WINDOW.format(n=loss_batches, es="" if loss_batches == 1 else "es")
        text += f" loss {loss:.4f} ({window})"
    if samples_per_s is not None:
        text += f" samples/s {samples_per_s:.1f} ({RATE_WINDOW})"
    return text


def epoch_line(
    split: str,
    scores: dict[str, Any],
    *,
    epoch: int = 0,
    epochs: int = 0,
    note: str = "",
    primary: str = "accuracy",
) -> str:
    """'training: epoch 2/3 validation acc 0.9100 (300 rows)', or for the test split
    'training: test acc 0.9400 f1 0.9455 (400 rows, weights of epoch 2)' (`epoch` counts from 0), from
    Scores.compute()'s dict; the primary metric is added when it is another (' mcc 0.4512'), and a
    further test split is named ('test validation_mismatched acc ...')."""
    if split == "validation":
        head = f"epoch {epoch + 1}/{epochs} validation"
    else:
        head = "test" if split == "test" else f"test {split.removeprefix('test_')}"
    parts = [] if scores["acc"] is None else [f"acc {scores['acc']:.4f}"]
    if split != "validation" and scores["f1"] is not None:
        parts.append(f"f1 {scores['f1']:.4f}")
    if primary not in ("accuracy", "f1") or scores["acc"] is None:
        value = scores["metrics"].get(primary)
        parts.append(f"{primary} {'-' if value is None else f'{value:.4f}'}")
    rows = scores["scored"]
    return f"{PREFIX}{head} {' '.join(parts)} ({rows} rows{', ' + note if note else ''})"


def result_line(samples_per_s: float | None, train_s: float) -> str:
    """The run's samples/s as result.json and `jobgen summary` have it, said with its window."""
    rate = f"{samples_per_s:.1f}" if samples_per_s is not None else "-"
    return f"{PREFIX}samples/s {rate} (timing window: {train_s:.1f} s of timed training batches; the summary's number)"


def heartbeat_line(phase: str, seconds: float) -> str:
    """'training: preparing data, 12 s so far'."""
    return f"{PREFIX}{phase}, {int(seconds)} s so far"


@dataclass(frozen=True)
class Progress:
    """What a progress line says (`epoch` counts from 1, as printed)."""

    epoch: int
    epochs: int
    percent: int
    step: int
    steps: int
    loss: float | None
    samples_per_s: float | None


def parse(text: str) -> Progress | None:
    """The progress line's numbers, or None for any other line (rank labels already stripped)."""
    found = PROGRESS_LINE.match(text.strip())
    if found is None:
        return None
    g = found.groupdict()
    return Progress(
        epoch=int(g["epoch"]),
        epochs=int(g["epochs"]),
        percent=int(g["percent"]),
        step=int(g["step"]),
        steps=int(g["steps"]),
        loss=float(g["loss"]) if g["loss"] is not None else None,
        samples_per_s=float(g["samples_per_s"]) if g["samples_per_s"] is not None else None,
    )


def is_progress(text: str) -> bool:
    """A progress line or a heartbeat: says where a job is, never why it failed."""
    line = text.strip()
    return bool(PROGRESS_LINE.match(line) or HEARTBEAT_LINE.match(line))


def heartbeat_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds without a line after which rank 0 prints one: `JOBGEN_HEARTBEAT_S`, default 10."""
    raw = (os.environ if env is None else env).get(HEARTBEAT_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return HEARTBEAT_S
    return value if 0 < value <= 3600 else HEARTBEAT_S
