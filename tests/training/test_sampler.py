"""The batch samplers' rules, for every split size, batch size and world size (hypothesis).

- training: equal steps on every rank; each sample exactly once per epoch before the top-up; the
  top-up is whole batches of repeats, marked; batches are the sampler's own (never re-cut); a resume
  at any batch neither loses nor repeats one; length grouping keeps padding small on IMDB-like lengths.
- evaluation: equal steps on every rank; each sample scored exactly once; padding rows are marked.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.loaders import EvalBatches, TrainBatches

pytestmark = pytest.mark.timeout(300)
PROPERTY = settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

sizes = st.integers(min_value=1, max_value=2500)
batch_sizes = st.integers(min_value=1, max_value=70)
worlds = st.integers(min_value=1, max_value=9)


def _lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(5, 400) for _ in range(n)]


def imdb_like(n: int, seed: int) -> list[int]:
    """Token counts shaped like IMDB reviews under a BERT tokenizer: log-normal, median ~230, cut at 512."""
    rng = random.Random(seed)
    return [min(512, max(12, int(rng.lognormvariate(math.log(230), 0.75)))) for _ in range(n)]


def _train_ranks(n: int, bs: int, world: int, group: bool, seed: int, epoch: int = 0) -> list[TrainBatches]:
    ranks = [TrainBatches(_lengths(n, seed), bs, r, world, group_by_length=group, seed=seed) for r in range(world)]
    for sampler in ranks:
        sampler.set_epoch(epoch)
    return ranks


@PROPERTY
@given(n=sizes, bs=batch_sizes, world=worlds, group=st.booleans(), seed=st.integers(0, 99), epoch=st.integers(0, 3))
def test_train_every_sample_once_equal_steps(n: int, bs: int, world: int, group: bool, seed: int, epoch: int) -> None:
    ranks = _train_ranks(n, bs, world, group, seed, epoch)
    shards = [list(s) for s in ranks]
    steps = math.ceil(math.ceil(n / bs) / world)
    assert all(len(shard) == len(s) == steps for shard, s in zip(shards, ranks, strict=True))
    fresh = sorted(i for shard in shards for b in shard for i in b if i < n)
    assert fresh == list(range(n))  # each sample exactly once before the top-up
    # The top-up is whole batches that repeat the epoch's first batches, and only what equal steps need.
    global_batches = ranks[0].global_batches()
    repeats = [b for shard in shards for b in shard if b[0] >= n]
    assert all(i >= n for b in repeats for i in b)
    assert len(repeats) == steps * world - len(global_batches)
    cycled = [global_batches[k % len(global_batches)] for k in range(len(repeats))]
    assert sorted(map(sorted, repeats)) == sorted(sorted(i + n for i in b) for b in cycled)
    # Batches are what the sampler meant: every one is one of its global batches, uncut.
    meant = {tuple(b) for b in global_batches}
    assert all(tuple(b) in meant for shard in shards for b in shard if b[0] < n)
    assert sum(len(b) != bs for b in global_batches) <= 1  # one short batch at most


@PROPERTY
@given(
    n=sizes,
    bs=batch_sizes,
    world=worlds,
    group=st.booleans(),
    seed=st.integers(0, 99),
    cut=st.floats(0, 1),
    epoch=st.integers(0, 3),
)
def test_resume_at_any_batch_loses_and_repeats_nothing(
    n: int, bs: int, world: int, group: bool, seed: int, cut: float, epoch: int
) -> None:
    whole = _train_ranks(n, bs, world, group, seed, epoch)
    steps = len(whole[0])
    done = int(cut * steps)
    for rank, sampler in enumerate(whole):
        before = list(sampler)[:done]
        resumed = TrainBatches(_lengths(n, seed), bs, rank, world, group_by_length=group, seed=seed)
        resumed.resume_at(epoch, done)
        resumed.set_epoch(epoch)
        assert before + list(resumed) == list(sampler)
        assert len(resumed) == steps  # Lightning sizes the epoch by len(): the whole epoch, not the rest
        resumed.set_epoch(epoch + 1)  # the next epoch starts from its first batch
        assert len(list(resumed)) == steps


@PROPERTY
@given(n=sizes, bs=batch_sizes, world=worlds, seed=st.integers(0, 99))
def test_eval_scores_every_sample_exactly_once(n: int, bs: int, world: int, seed: int) -> None:
    ranks = [EvalBatches(_lengths(n, seed), bs, r, world) for r in range(world)]
    shards = [list(s) for s in ranks]
    steps = math.ceil(math.ceil(n / world) / bs)
    assert all(len(shard) == len(s) == steps for shard, s in zip(shards, ranks, strict=True))
    scored = sorted(i for shard in shards for b in shard for i in b if i < n)
    assert scored == list(range(n))
    assert all(len(b) == 1 for shard in shards for b in shard if b[0] >= n)  # a padding step is one row
    assert all(all(i < n for i in b) or all(i >= n for i in b) for shard in shards for b in shard)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(n=st.integers(2000, 40000), bs=st.sampled_from([8, 16, 32]), world=st.integers(1, 8), seed=st.integers(0, 99))
def test_grouping_keeps_padding_under_5_percent(n: int, bs: int, world: int, seed: int) -> None:
    lengths = imdb_like(n, seed)
    real = slots = 0
    for rank in range(world):
        sampler = TrainBatches(lengths, bs, rank, world, group_by_length=True, seed=seed)
        for batch in sampler:
            rows = [lengths[i % n] for i in batch]
            real, slots = real + sum(rows), slots + max(rows) * len(rows)
    assert 1 - real / slots <= 0.05


def test_ungrouped_padding_is_what_grouping_saves() -> None:
    """The same lengths without grouping pad far more: the grouping test above can fail."""
    lengths = imdb_like(35_007, 0)
    sampler = TrainBatches(lengths, 16, group_by_length=False, seed=0)
    real = sum(lengths)
    slots = sum(max(lengths[i] for i in b) * len(b) for b in sampler)
    assert 1 - real / slots > 0.3


def test_samplers_refuse_impossible_shapes() -> None:
    with pytest.raises(ValueError):
        TrainBatches([1, 2], 0)
    with pytest.raises(ValueError):
        EvalBatches([1, 2], 4, rank=2, world=2)
