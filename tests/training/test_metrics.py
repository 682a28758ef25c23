"""Scores against torchmetrics (micro accuracy, binary F1) for every size, split over any number of ranks."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
torchmetrics = pytest.importorskip("torchmetrics")

from training.metrics import Scores  # noqa: E402


def _reference(preds, labels, num_classes):
    acc = torchmetrics.functional.accuracy(preds, labels, task="multiclass", num_classes=num_classes)
    f1 = torchmetrics.functional.f1_score(preds, labels, task="binary") if num_classes == 2 else None
    return float(acc), (None if f1 is None else float(f1))


@settings(max_examples=40, deadline=None)
@given(
    num_classes=st.integers(2, 5),
    n=st.integers(1, 90),
    ranks=st.integers(1, 4),
    batch=st.integers(1, 17),
    seed=st.integers(0, 10_000),
    repeats=st.integers(0, 5),
)
@example(num_classes=2, n=1, ranks=3, batch=1, seed=0, repeats=0)  # a rank with no row to score
def test_scores_equal_torchmetrics_over_ranks_and_batches(num_classes, n, ranks, batch, seed, repeats):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n + repeats, num_classes, generator=gen)
    labels = torch.randint(0, num_classes, (n + repeats,), generator=gen)
    rows = torch.cat([torch.arange(n), -torch.ones(repeats, dtype=torch.int64)])  # repeats: never scored
    # Each rank scores its own strided share in batches; the counts are what one all_reduce sums.
    total = torch.zeros(5, dtype=torch.int64)
    for rank in range(ranks):
        scores = Scores(num_classes)
        index = torch.arange(n + repeats)[rank::ranks]  # empty for a rank past the last row (n=1, 3 ranks)
        for start in range(0, len(index), batch):
            part = index[start : start + batch]
            scores.update(logits[part], labels[part], rows[part])
        total += scores.counts
    merged = Scores(num_classes)
    merged.counts += total
    got = merged.compute()
    acc, f1 = _reference(logits[:n].argmax(-1), labels[:n], num_classes)
    assert got["scored"] == n
    assert got["acc"] == pytest.approx(acc, abs=1e-6)
    if num_classes == 2:
        assert got["f1"] == pytest.approx(f1, abs=1e-6)
    else:
        assert got["f1"] is None
    assert merged.compute()["scored"] == 0  # compute() resets


def test_f1_is_zero_without_a_positive_and_accuracy_counts_every_row():
    scores = Scores(2)
    scores.update(torch.tensor([[2.0, 0.0]] * 3), torch.tensor([0, 0, 0]))
    assert scores.compute() == {"acc": 1.0, "f1": 0.0, "scored": 3}
    scores.update(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([1, 1]))
    assert scores.compute() == {"acc": 0.5, "f1": pytest.approx(2 / 3), "scored": 2}
