"""The job log's one output layer: every engine's progress in one format (training/progress.py), from
rank 0 only, with a heartbeat while nothing else is printed; and the libraries' own bars, tips and
notices turned off where they are made.

    console.start(rank)                      # training.run, first thing: the heartbeat starts
    console.phase("preparing data")          # what a heartbeat says while not training
    console.training(tracker)                # while training: the heartbeat is the progress line
    tracker.batch_done(...)                  # per batch, from each engine's loop or callback
    console.say(line)                        # any line of ours (rank 0 only)
    console.line(line, err=True)             # a line from any rank (a signal, a checkpoint, a warning)
    console.stop()

Noise is removed by exact, known message or by the library's own switch, never by silencing a
logger or a warning category: a real warning, an error or a traceback still reaches the log.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from typing import Any

from training import progress

HEARTBEAT_MARGIN = 0.7  # a heartbeat once nothing was said for 70% of the promised interval

# Warnings that say nothing to a jobgen user, each matched by its exact text (a regex of its start).
KNOWN_WARNINGS = (
    # torch 2.13 deprecates LeafSpec; Lightning 2.6's _pytree still builds one. Not the user's code.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # torch 2.13 deprecates the collectives DeepSpeed's ZeRO-3 calls at every step: two lines a step a rank.
    r"`torch.distributed.all_gather_into_tensor` is deprecated",
    r"`torch.distributed.reduce_scatter_tensor` is deprecated",
    # torch's distributed checkpoint, saving the epoch's "last" checkpoint of FSDP over the one before it.
    r"Detected an existing checkpoint in .*, overwriting since self.overwrite=True",
    # jobgen resumes into its own checkpoint folder on purpose (requeue, rerun).
    r"Checkpoint directory .* exists and is not empty",
    # jobgen's batch sampler resumes mid-epoch itself (docs/contracts.md, "Across a requeue").
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not resumable",
)
# Lightning's notices (logged at INFO through its rank_zero loggers), each by the start of its text.
KNOWN_NOTICES = (
    "GPU available: ",
    "TPU available: ",
    "HPU available: ",
    "💡 Tip: For seamless cloud logging",
    "Loading `train_dataloader` to estimate number of stepping batches.",
    "`Trainer.fit` stopped: `max_epochs=",  # the progress lines show the last epoch end
)
NOTICE_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning_utilities.core.rank_zero",
)


class _KnownNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot be formatted is not ours to judge
            return True
        return not text.startswith(KNOWN_NOTICES)


_NOTICES = _KnownNotices()


def quiet_libraries(on_cpu: bool) -> None:
    """Turn off, at their source, what the libraries print that no jobgen user asked for. Called before
    they are imported (environment variables they read at import), and again harmlessly after."""
    if on_cpu:
        # transformers' save/load imports DeepSpeed wherever it is installed (accelerate's
        # extract_model_from_parallel), and DeepSpeed's accelerator probe then warns "Setting
        # accelerator to CPU" in jobs that never use it. On CPU that is what it picks anyway.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # transformers' "Loading weights" and "Writing model shards" bars (and the hub's download bars).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported already (a test run in-process): its switch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    for message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in NOTICE_LOGGERS:
        logger = logging.getLogger(name)
        if _NOTICES not in logger.filters:
            logger.addFilter(_NOTICES)


def rank_from_env() -> int:
    """This process' global rank as far as the launcher said (before any engine knows): torchrun's
    RANK, srun's SLURM_PROCID, or LOCAL_RANK for the processes Lightning and Fabric start themselves."""
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


class Console:
    """Rank 0's lines, and the heartbeat thread that prints one when nothing was said for a while."""

    def __init__(self) -> None:
        self.rank = 0
        self.interval = progress.HEARTBEAT_S
        self._lock = threading.RLock()
        self._last = time.monotonic()
        self._phase, self._since = "starting", time.monotonic()
        self._tracker: Tracker | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, rank: int, interval: float | None = None, since: float | None = None) -> None:
        """`since`: the monotonic time the silence began, when before now (the process' start: torch
        may have been imported before the console could speak)."""
        self.stop()
        self.rank = rank
        self.interval = progress.heartbeat_s() if interval is None else interval
        now = time.monotonic()
        self._last = min(now, since) if since is not None else now
        self.phase("starting")
        self._since = self._last
        if rank != 0:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="jobgen-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        self._tracker = None

    def set_rank(self, rank: int) -> None:
        """The engine's own word on this process' rank: a rank that is not 0 goes quiet."""
        if rank != 0 and self.rank == 0:
            self.stop()
        self.rank = rank

    def say(self, text: str) -> None:
        if self.rank == 0:
            self.line(text)

    def line(self, text: str, *, err: bool = False) -> None:
        """A line from any rank (say() is rank 0's). One write of the line and its newline, under the
        lock: print() writes them apart, and a heartbeat written between the two once joined two lines."""
        stream = sys.stderr if err else sys.stdout
        with self._lock:
            stream.write(text + "\n")
            stream.flush()
            self._last = time.monotonic()

    def phase(self, name: str) -> None:
        """What the job does now (a heartbeat says it with its seconds so far); training stops."""
        with self._lock:
            self._phase, self._since, self._tracker = name, time.monotonic(), None

    def training(self, tracker: Tracker) -> None:
        with self._lock:
            self._tracker = tracker

    def quiet_for(self) -> float:
        return time.monotonic() - self._last

    def _beat(self) -> None:
        # Due a little before the promised interval: a thread waits for the interpreter while the main
        # thread holds it (loading a C extension such as torch's can take seconds on a busy machine).
        due = self.interval * HEARTBEAT_MARGIN
        while not self._stop.wait(max(0.05, due - self.quiet_for())):
            with self._lock:
                if self.quiet_for() < due:
                    continue
                # No local name for the tracker: this thread would hold it while it waits, and through
                # its clock the whole job, the model and its process group past their teardown (issue 20).
                text = self._tracker.line() if self._tracker is not None else None
                self.say(text or progress.heartbeat_line(self._phase, time.monotonic() - self._since))


CONSOLE = Console()
start, stop, say, line, phase, set_rank = (
    CONSOLE.start,
    CONSOLE.stop,
    CONSOLE.say,
    CONSOLE.line,
    CONSOLE.phase,
    CONSOLE.set_rank,
)


def training(tracker: Tracker) -> None:
    CONSOLE.training(tracker)


class Tracker:
    """Where training is, for the progress line: fed per batch by the engine (rank 0's view), read by
    the engine's own lines and by the heartbeat thread (under the console's lock).

    `stats` and `clock` are the run's Stats and TrainClock: samples/s is read from their counters as
    they are, never timed here (training/timing.py owns the window)."""

    def __init__(self, stats: Any, clock: Any, *, epochs: int, batches: int, steps: int, world: int) -> None:
        self.stats, self.clock, self.world = stats, clock, world
        self.epochs, self.batches, self.steps = epochs, batches, steps
        self.epoch = self.batch = self.step = 0
        self._loss_sum, self._loss_n = 0.0, 0
        self._printed = False

    def at(self, epoch: int, batch: int, step: int) -> None:
        """Where the next batch starts (an epoch's start, or a resume mid-epoch)."""
        with CONSOLE._lock:
            self.epoch, self.batch, self.step = epoch, batch, step

    def batch_done(self, epoch: int, batch: int, step: int, loss: float | None, losses: int = 1) -> None:
        """One training batch done (`batch` of this epoch's batches now done). `loss`: the mean loss of
        `losses` batches (1: this one; the HF Trainer reports a mean over its logging window)."""
        with CONSOLE._lock:
            self.epoch, self.batch, self.step = epoch, batch, step
            self.add_loss(loss, losses)
            quiet = CONSOLE.quiet_for() >= CONSOLE.interval * HEARTBEAT_MARGIN
            due = not self._printed or batch >= self.batches or quiet
            if due:
                self._printed = True
                say(self.line())

    def add_loss(self, loss: float | None, losses: int = 1) -> None:
        if loss is not None and losses > 0:
            with CONSOLE._lock:
                self._loss_sum += loss * losses
                self._loss_n += losses

    def samples_per_s(self) -> float | None:
        """The summary's samples/s so far: timed rows over timed seconds (docs/contracts.md). Rows not
        yet summed over the ranks are rank 0's, times the world size."""
        seconds = self.stats.times_s.get("train", 0.0)
        rows = self.stats.timed_samples + self.clock.local.get("timed_samples", 0) * self.world
        return rows / seconds if seconds > 0 and rows > 0 else None

    def line(self) -> str:
        """The progress line now; the loss window starts again after it."""
        with CONSOLE._lock:
            loss = self._loss_sum / self._loss_n if self._loss_n else None
            text = progress.progress_line(
                epoch=self.epoch,
                epochs=self.epochs,
                batch=self.batch,
                batches=self.batches,
                step=self.step,
                steps=self.steps,
                loss=loss,
                loss_batches=self._loss_n,
                samples_per_s=self.samples_per_s(),
            )
            self._loss_sum, self._loss_n = 0.0, 0
            return text
