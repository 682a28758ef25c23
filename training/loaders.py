"""Batches: which samples each rank sees (sharding, shuffling, length grouping) and how they are padded.

The samplers here decide whole batches (they are DataLoader batch samplers), so a batch is exactly
what they meant: length grouping survives any split size, and nothing downstream re-cuts the stream.
One pair of samplers serves every engine, so Lightning and Fabric are told not to swap in their own
DistributedSampler: identical work per step across engines is what makes benchmarks comparable.

Indices a sampler yields are positions in the split, with one extension read by `Rows`: an index
k >= n (the split's size) means "row k - n again". Training uses it for the top-up batches that keep
ranks in step; evaluation uses it for padding rows, which are run (sharded models need every rank
in every step) but never scored. Each batch carries a `row` tensor: the row's position, or a
negative number for such a repeat.
"""

from __future__ import annotations

import functools
import math
import random
import signal
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any, cast

from training.spec import Spec

COMPILE_BUCKET = 32  # padded lengths round up to this when compiling, so graphs get reused
GROUP_WINDOW = 50  # batches per megabatch when grouping by length (as HF's LengthGroupedSampler)
MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels")


class TrainBatches:
    """This rank's training batches: seeded per-epoch shuffle, optional length grouping, equal steps.

    Every rank builds the same global list of batches and takes every world-th one, so under length
    grouping the ranks' batches in one step have similar lengths too. When the batches do not divide
    among the ranks, the ranks that are short repeat batches from the start of the epoch (marked as
    repeats): sharded models need every rank to run the same number of steps. Each sample is trained
    exactly once per epoch before that top-up.

    `resume_at(epoch, done)` makes the next `set_epoch(epoch)` skip the `done` batches already trained
    in that epoch, so a requeued job continues the epoch where it stopped.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        group_by_length: bool = False,
        seed: int = 0,
    ) -> None:
        if batch_size < 1 or world < 1 or not 0 <= rank < world:
            raise ValueError(f"batch_size={batch_size}, rank={rank}, world={world}")
        self.lengths, self.batch_size = list(lengths), batch_size
        self.rank, self.world = rank, world
        self.shuffle, self.group_by_length, self.seed = shuffle, group_by_length, seed
        self.epoch, self.skip = 0, 0
        self._resume: tuple[int, int] | None = None
        self.sampler = _EpochHook(self)

    def resume_at(self, epoch: int, batches_done: int) -> None:
        self._resume = (epoch, batches_done)

    def set_epoch(self, epoch: int) -> None:
        """Called by our loops and by Lightning before each epoch (Lightning looks for this name)."""
        self.epoch, self.skip = epoch, self.skip_for(epoch)

    def skip_for(self, epoch: int) -> int:
        """Batches of `epoch` done before a requeue (0 for an epoch not resumed)."""
        return self._resume[1] if self._resume and self._resume[0] == epoch else 0

    def global_batches(self) -> list[list[int]]:
        """Every rank's batches of this epoch, in step order, before the top-up."""
        n = len(self.lengths)
        order = list(range(n))
        rng = random.Random(self.seed + self.epoch)
        if self.shuffle:
            rng.shuffle(order)
        if self.group_by_length:
            # Megabatches: sort inside windows of GROUP_WINDOW batches, then shuffle the batches, so
            # each batch is homogeneous in length while the order of batches stays random.
            window = self.batch_size * GROUP_WINDOW
            order = [
                i for s in range(0, n, window) for i in sorted(order[s : s + window], key=lambda j: -self.lengths[j])
            ]
        batches = [order[s : s + self.batch_size] for s in range(0, n, self.batch_size)]
        if self.group_by_length and self.shuffle:
            rng.shuffle(batches)
        return batches

    def epoch_batches(self) -> list[list[int]]:
        """This rank's batches of the whole epoch (top-up repeats as index + n), before any skip."""
        batches, n = self.global_batches(), len(self.lengths)
        steps = math.ceil(len(batches) / self.world)
        topup = [[i + n for i in batches[k % len(batches)]] for k in range(steps * self.world - len(batches))]
        return (batches + topup)[self.rank :: self.world]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.epoch_batches()[self.skip :]

    def __len__(self) -> int:
        """Batches in a whole epoch (Lightning sizes its epoch and LR schedule by this)."""
        return math.ceil(math.ceil(len(self.lengths) / self.batch_size) / self.world)

    def num_batches(self) -> int:
        return len(self)


class _EpochHook:
    """Lightning calls set_epoch on `batch_sampler.sampler` (not on the batch sampler): forward it."""

    def __init__(self, batches: TrainBatches) -> None:
        self.batches = batches

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)


class EvalBatches:
    """This rank's evaluation batches: every sample of the split exactly once over all ranks.

    Samples are sorted by length (less padding; order does not change a score) and dealt to ranks in
    turn. Every rank runs the same number of batches; a rank that runs out fills its last steps with a
    single padding row, which `Scores` leaves out.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, rank: int = 0, world: int = 1) -> None:
        if batch_size < 1 or world < 1 or not 0 <= rank < world:
            raise ValueError(f"batch_size={batch_size}, rank={rank}, world={world}")
        self.n, self.batch_size, self.rank, self.world = len(lengths), batch_size, rank, world
        self.order = sorted(range(self.n), key=lambda i: -lengths[i])

    def __iter__(self) -> Iterator[list[int]]:
        mine = self.order[self.rank :: self.world]
        batches = [mine[s : s + self.batch_size] for s in range(0, len(mine), self.batch_size)]
        pad = [self.n + (mine[0] if mine else 0)]  # a real row to run, marked as a repeat
        yield from batches + [pad] * (len(self) - len(batches))

    def __len__(self) -> int:
        return math.ceil(math.ceil(self.n / self.world) / self.batch_size)


class Rows:
    """A split as the loaders read it: index k < n is row k; k >= n is row k - n again, marked by a
    negative `row` (-1 - (k - n)) so that training counts it as a repeat and evaluation skips it."""

    def __init__(self, ds: Any) -> None:
        self.ds, self.n = ds, len(ds)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> dict[str, Any]:
        return self.__getitems__([k])[0]

    def __getitems__(self, keys: list[int]) -> list[dict[str, Any]]:
        columns = self.ds[[k % self.n for k in keys]]
        rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
        for row, k in zip(rows, keys, strict=True):
            row["row"] = k if k < self.n else -1 - (k - self.n)
        return rows


class Collator:
    """Pads a list of tokenized rows: to the batch's longest (dynamic) or to max_length (the baseline)."""

    def __init__(self, tokenizer: Any, padding: str, max_length: int, bucket: int | None = None) -> None:
        self.tokenizer, self.max_length, self.bucket = tokenizer, max_length, bucket
        self.padding = "max_length" if padding == "max_length" else "longest"

    def __call__(self, rows: list[dict[str, Any]]) -> MutableMapping[str, Any]:
        import torch

        features = [{k: v for k, v in r.items() if k not in ("length", "row", "jobgen_row")} for r in rows]
        batch: MutableMapping[str, Any] = self.tokenizer.pad(  # a transformers BatchEncoding
            features,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.bucket,
            return_tensors="pt",
        )
        if rows and "row" in rows[0]:
            batch["row"] = torch.tensor([r["row"] for r in rows], dtype=torch.long)
        return batch


def make_loader(ds: Any, spec: Spec, tokenizer: Any, train: bool, rank: int = 0, world: int = 1) -> Any:
    from torch.utils.data import DataLoader, Dataset

    t, d = spec.train, spec.data
    if train:
        batches: Any = TrainBatches(
            list(ds["length"]), t.batch_size, rank, world, shuffle=True, group_by_length=d.group_by_length, seed=t.seed
        )
    else:
        batches = EvalBatches(list(ds["length"]), t.eval_batch_size, rank, world)
    bucket = COMPILE_BUCKET if t.compile and d.padding == "dynamic" else None
    return DataLoader(
        cast("Dataset[Any]", Rows(ds)),  # a map-style dataset by its methods, not by subclassing
        batch_sampler=batches,
        num_workers=t.num_workers,
        collate_fn=Collator(tokenizer, d.padding, d.max_length, bucket),
        persistent_workers=t.num_workers > 0,
        worker_init_fn=_spare_workers(spec) if t.num_workers > 0 and spec.requeue.enabled else None,
    )


def _spare_workers(spec: Spec) -> Any:
    import os

    from training.requeue import signum

    return functools.partial(_spare_worker, os.getpid(), signum(spec.requeue.signal))


def _spare_worker(rank_pid: int, warning: int, worker_id: int) -> None:
    """In each DataLoader worker (requeue on). Slurm signals every process of a step, workers too, and a
    worker that died of it (torch's SIGTERM handler there spares only its parent's, the warning signal
    kills by default) would fail its rank ("DataLoader worker ... killed by signal") before the
    checkpoint. So the warning signal is ignored, and SIGTERM ends the worker only when its rank sends
    it (torch's and multiprocessing's shutdown of the workers): a thread waits for it with the sender's
    pid, the other threads keep it blocked."""
    import os
    import threading

    if warning != signal.SIGTERM:
        signal.signal(warning, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _no_op)  # not SIG_IGN: an ignored signal never reaches sigwaitinfo
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == rank_pid:
                os._exit(0)

    threading.Thread(target=wait, name="jobgen-sigterm", daemon=True).start()


def _no_op(number: int, frame: Any) -> None:
    pass


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """What the model's forward takes: the batch without our bookkeeping columns."""
    return {k: v for k, v in batch.items() if k in MODEL_KEYS}


def token_counts(batch: dict[str, Any]) -> tuple[int, int]:
    """(real tokens, padded slots) in a batch, from its attention mask."""
    mask = batch["attention_mask"]
    return int(mask.sum()), int(mask.numel())


def repeats(batch: dict[str, Any]) -> int:
    """Rows in a batch that repeat a sample (training top-up)."""
    row = batch.get("row")
    return 0 if row is None else int((row < 0).sum())
