"""Scores against scikit-learn and SciPy for every problem type, size, batch size and world size.

The ranks' share of a split is dealt as EvalBatches deals it (padding rows included, marked as repeats
by Rows' rule); merge() is the gather-and-dedupe every rank runs on what all_gather_object collected.
The property tests run that rule in one process for all sizes; test_gather_over_real_ranks runs it
for real, over gloo, in 2 and 3 processes. The references (scikit-learn, SciPy) answer from a process
of their own (tests/training/metric_reference.py), so they never sit on this process' path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from training.loaders import EvalBatches  # noqa: E402
from training.metrics import Scores, merge, metrics, predictions  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / ".venv" / "reference"


class Reference:
    """One long-lived reference process: a JSON request per line, a JSON answer per line."""

    def __init__(self) -> None:
        if not (REFERENCE / "sklearn").is_dir() or not (REFERENCE / "scipy").is_dir():
            raise AssertionError(f"scikit-learn and SciPy are not in {REFERENCE}: run scripts/bootstrap.sh")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("metric_reference.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def reference() -> Any:
    ref = Reference()
    yield ref
    ref.close()


def _outputs(kind: str, n: int, classes: int, seed: int) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(seed)
    if kind == "regression":
        labels = torch.randn(n, generator=gen) * 2 + 1
        # Ties on both sides (Spearman's average ranks): round a third of them to one decimal.
        labels[: n // 3] = torch.round(labels[: n // 3] * 10) / 10
        logits = (labels + torch.randn(n, generator=gen)).unsqueeze(1)
        logits[: n // 4] = torch.round(logits[: n // 4] * 10) / 10
        return logits, labels
    if kind == "multi_label":
        return torch.randn(n, classes, generator=gen), torch.randint(0, 2, (n, classes), generator=gen).float()
    return torch.randn(n, classes, generator=gen), torch.randint(0, classes, (n,), generator=gen)


def _shares(kind: str, logits: Any, labels: Any, classes: int, ranks: int, batch: int) -> list[Any]:
    """Each rank's Scores.local() after scoring its EvalBatches batches (padding rows marked as Rows does)."""
    n = len(labels)
    out = []
    for rank in range(ranks):
        scores = Scores(kind, 1 if kind == "regression" else classes)
        for keys in EvalBatches([1] * n, batch, rank, ranks):
            index = torch.tensor([k % n for k in keys])
            rows = torch.tensor([k if k < n else -1 - (k - n) for k in keys])
            scores.update(logits[index], labels[index], rows)
        out.append(scores.local())
    return out


def _close(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want), (got, want)
    for key, value in want.items():
        if value is None:
            assert got[key] is None, (key, got, want)
        else:
            assert got[key] == pytest.approx(value, abs=1e-6), (key, got, want)


def _reference_request(kind: str, preds: Any, classes: int) -> dict[str, Any]:
    return {"kind": kind, "label": preds.label.tolist(), "prediction": preds.prediction.tolist(), "classes": classes}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["single_label", "multi_label", "regression"]),
    classes=st.integers(2, 5),
    n=st.integers(1, 120),
    ranks=st.integers(1, 3),
    batch=st.integers(1, 17),
    seed=st.integers(0, 10_000),
)
@example(kind="single_label", classes=2, n=1, ranks=3, batch=1, seed=0)  # ranks with nothing but padding
@example(kind="regression", classes=2, n=601, ranks=3, batch=16, seed=1)
@example(kind="single_label", classes=3, n=601, ranks=3, batch=16, seed=2)
@example(kind="multi_label", classes=5, n=601, ranks=2, batch=16, seed=3)
def test_scores_equal_the_references_over_ranks_and_batches(reference, kind, classes, n, ranks, batch, seed):
    logits, labels = _outputs(kind, n, classes, seed)
    rows, merged_labels, outputs = merge(_shares(kind, logits, labels, classes, ranks, batch))
    assert rows.tolist() == list(range(n))  # every sample once, in row order, padding dropped
    preds = predictions(kind, rows, merged_labels, outputs)
    num_labels = 1 if kind == "regression" else classes
    got = metrics(preds, num_labels)
    whole = predictions(kind, np.arange(n), labels.double().numpy(), logits.reshape(n, -1).double().numpy())
    assert got == metrics(whole, num_labels)  # the ranks' merge is the whole split, to the last bit
    _close(got, reference.ask(**_reference_request(kind, preds, classes)))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 300),
    ranks=st.integers(1, 8),
    batch=st.integers(1, 40),
    order=st.randoms(use_true_random=False),
)
def test_merge_keeps_every_row_once_sorted_whatever_the_ranks_order(n, ranks, batch, order):
    """The gather-and-dedupe rule alone: any split size, world size, batch size and order of arrival."""
    parts = []
    for rank in range(ranks):
        keys = [k for b in EvalBatches([1] * n, batch, rank, ranks) for k in b]
        rows = np.array([k if k < n else -1 - (k - n) for k in keys], dtype=np.int64)
        source = np.array([k % n for k in keys], dtype=np.int64) if n else np.zeros(len(keys), np.int64)
        parts.append((rows, source.astype(float), source.reshape(-1, 1).astype(float)))
    order.shuffle(parts)
    parts.append(parts[0])  # a rank's rows twice still count once
    rows, labels, outputs = merge(parts)
    assert rows.tolist() == list(range(n))
    assert labels.tolist() == list(range(n)) and outputs[:, 0].tolist() == list(range(n))  # rows kept their own


def test_small_cases_by_hand():
    two = predictions("single_label", np.arange(3), np.array([0.0, 0.0, 0.0]), np.eye(2)[[0, 0, 0]])
    assert metrics(two, 2) == {"accuracy": 1.0, "macro_f1": 1.0, "f1": 0.0, "mcc": 0.0}
    assert two.score.tolist() == pytest.approx([1 / (1 + np.exp(-1))] * 3)
    flat = predictions("regression", np.arange(3), np.array([1.0, 2.0, 3.0]), np.array([[5.0], [5.0], [5.0]]))
    assert metrics(flat, 1) == {"pearson": None, "spearman": None, "mse": pytest.approx((16 + 9 + 4) / 3)}
    assert Scores("single_label", 2).compute()["scored"] == 0  # nothing scored: no metric, no error


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    """One rank: score this rank's share of several splits, compute() over gloo, write what it got."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    got = []
    for kind, classes, n, seed in CASES:
        logits, labels = _outputs(kind, n, classes, seed)
        scores = Scores(kind, 1 if kind == "regression" else classes)
        for keys in EvalBatches([1] * n, 16, rank, world):
            index = torch.tensor([k % n for k in keys])
            rows = torch.tensor([k if k < n else -1 - (k - n) for k in keys])
            scores.update(logits[index], labels[index], rows)
        result = scores.compute()
        got.append(
            {"metrics": result["metrics"], "scored": result["scored"], "rows": result["predictions"].row.tolist()}
        )
    Path(out, f"rank{rank}.json").write_text(json.dumps(got))
    dist.destroy_process_group()


CASES = [
    ("single_label", 3, 601, 11),
    ("single_label", 2, 601, 12),
    ("regression", 2, 601, 13),
    ("multi_label", 4, 37, 14),
]


@pytest.mark.parametrize("world", [2, 3])
def test_gather_over_real_ranks(world, tmp_path, reference):
    """Real processes and a gloo group: every rank computes the same metrics, those of the whole split."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(world, port, str(tmp_path)), nprocs=world, start_method="spawn")
    answers = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(a == answers[0] for a in answers)  # identical on every rank
    for (kind, classes, n, seed), got in zip(CASES, answers[0], strict=True):
        logits, labels = _outputs(kind, n, classes, seed)
        whole = predictions(kind, np.arange(n), labels.double().numpy(), logits.reshape(n, -1).double().numpy())
        num_labels = 1 if kind == "regression" else classes
        assert got["scored"] == n and got["rows"] == list(range(n))
        assert got["metrics"] == metrics(whole, num_labels)
        _close(got["metrics"], reference.ask(**_reference_request(kind, whole, classes)))
