"""Batches: which samples each rank sees (sharding, shuffling, length grouping) and how they are padded.

One sampler serves all three engines, so Lightning and Fabric are told not to swap in their own
DistributedSampler: identical work per step across engines is what makes benchmarks comparable.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

from training.spec import Spec

COMPILE_BUCKET = 32  # padded lengths round up to this when compiling, so graphs get reused


class ShardedSampler:
    """Indices for one rank: seeded per-epoch shuffle, optional length grouping, same steps per rank.

    Every rank builds the same global order and takes every world-th batch, so under length grouping
    the ranks' batches in one step have similar lengths too. Short shards are topped up with repeats
    (as DistributedSampler does): sharded models need every rank to run the same number of steps.
    """

    def __init__(self, lengths: list[int], batch_size: int, rank: int = 0, world: int = 1,
                 shuffle: bool = True, group_by_length: bool = False, seed: int = 0) -> None:
        self.lengths, self.batch_size = lengths, batch_size
        self.rank, self.world = rank, world
        self.shuffle, self.group_by_length, self.seed = shuffle, group_by_length, seed
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Lightning calls this with the epoch; our loops also pass batches already done (resume)."""
        self.epoch, self.skip = epoch, skip_batches

    def _global_batches(self) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        rng = random.Random(self.seed + self.epoch)
        if self.shuffle:
            rng.shuffle(order)
        if self.group_by_length:
            # Megabatches (as HF's LengthGroupedSampler): sort inside windows of 50 batches, then
            # shuffle the batches, so batches are homogeneous in length but their order stays random.
            window = self.batch_size * 50
            order = [i for s in range(0, len(order), window)
                     for i in sorted(order[s:s + window], key=lambda j: -self.lengths[j])]
        batches = [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        if self.group_by_length and self.shuffle:
            rng.shuffle(batches)
        return batches

    def _mine(self) -> list[list[int]]:
        batches = self._global_batches()
        per_rank = math.ceil(len(batches) / self.world)
        batches += batches[: per_rank * self.world - len(batches)]
        return batches[self.rank::self.world]

    def __iter__(self) -> Iterator[int]:
        for batch in self._mine()[self.skip:]:
            yield from batch

    def __len__(self) -> int:
        return sum(len(b) for b in self._mine()[self.skip:])

    def num_batches(self) -> int:
        return len(self._mine())


class Collator:
    """Pads a list of tokenized rows: to the batch's longest (dynamic) or to max_length (the baseline)."""

    def __init__(self, tokenizer: Any, padding: str, max_length: int, bucket: int | None = None) -> None:
        self.tokenizer, self.max_length, self.bucket = tokenizer, max_length, bucket
        self.padding = "max_length" if padding == "max_length" else "longest"

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        features = [{k: v for k, v in r.items() if k != "length"} for r in rows]
        return self.tokenizer.pad(features, padding=self.padding, max_length=self.max_length,
                                  pad_to_multiple_of=self.bucket, return_tensors="pt")


def make_loader(ds: Any, spec: Spec, tokenizer: Any, train: bool, rank: int = 0, world: int = 1) -> Any:
    from torch.utils.data import DataLoader

    t, d = spec.train, spec.data
    size = t.batch_size if train else t.eval_batch_size
    sampler = ShardedSampler(ds["length"], size, rank, world, shuffle=train,
                             group_by_length=d.group_by_length and train, seed=t.seed)
    bucket = COMPILE_BUCKET if t.compile and d.padding == "dynamic" else None
    return DataLoader(ds, batch_size=size, sampler=sampler, num_workers=t.num_workers,
                      collate_fn=Collator(tokenizer, d.padding, d.max_length, bucket),
                      persistent_workers=t.num_workers > 0)


def token_counts(batch: dict[str, Any]) -> tuple[int, int]:
    """(real tokens, padded slots) in a batch, from its attention mask."""
    mask = batch["attention_mask"]
    return int(mask.sum()), int(mask.numel())
