"""Every metric of a split from its predictions, gathered from all ranks; the same on any world size.

Each rank keeps (row, label, output) of the rows it scored. compute() gathers them on every rank,
drops repeats (a negative `row`: padding of training/loaders.py's EvalBatches) and any row seen twice,
sorts by row, and computes every metric of the problem type (training/contract.py's TASKS) in float64
numpy on every rank alike: metrics that need every prediction (Spearman, MCC, macro-F1) are exact, and
each sample counts once. The formulas are scikit-learn's and SciPy's (tests/training/test_metrics.py
compares them to 1e-6); no scikit-learn, SciPy or torchmetrics in the ranks (their imports cost seconds
of CPU in each).

Predictions: single-label, the arg-max class and its softmax probability; multi-label, the classes
whose sigmoid is above 0.5 (logit > 0) and their probabilities; regression, the output itself.
Undefined values (Pearson of a constant) are None.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

from training.contract import LOWER_IS_BETTER, TASKS, metric_problem, primary_metric


@dataclass(frozen=True)
class Predictions:
    """One split's predictions, one per sample, sorted by row (the sample's position in the split).
    single_label: label and prediction are class ids (int64), score the prediction's probability;
    multi_label: label and prediction are 0/1 matrices (samples x classes), score the probabilities;
    regression: label and prediction are floats, score the prediction."""

    problem_type: str
    row: Any
    label: Any
    prediction: Any
    score: Any


class Scores:
    """`truth`: the split's `labels` column, by row. When given, the metrics use it rather than the
    labels that went through the batches (a float target there is float32: not the source's value)."""

    def __init__(self, problem_type: str, num_labels: int, device: Any = "cpu", truth: Any = None) -> None:
        self.problem_type, self.num_labels, self.device, self.truth = problem_type, num_labels, device, truth
        self.parts: list[tuple[Any, Any, Any]] = []

    def update(self, logits: Any, labels: Any, rows: Any = None) -> None:
        import torch

        if rows is None:
            rows = torch.arange(len(labels))
        self.parts.append((rows.detach().cpu(), labels.detach().float().cpu(), logits.detach().float().cpu()))

    def local(self) -> tuple[Any, Any, Any]:
        """(rows, labels, outputs) this rank scored, as numpy arrays (float64 outputs)."""
        import numpy as np

        width = self.num_labels
        if not self.parts:
            labels_shape = (0, width) if self.problem_type == "multi_label" else (0,)
            return np.zeros(0, np.int64), np.zeros(labels_shape), np.zeros((0, width))
        rows = np.concatenate([r.numpy() for r, _, _ in self.parts]).astype(np.int64)
        labels = np.concatenate([lab.numpy() for _, lab, _ in self.parts]).astype(np.float64)
        outputs = np.concatenate([o.reshape(len(o), -1).numpy() for _, _, o in self.parts]).astype(np.float64)
        return rows, labels, outputs

    def compute(self) -> dict[str, Any]:
        """The split's scores over every rank's rows (a gather when a process group exists); then reset.
        {"metrics": {name: value}, "scored": rows, "acc", "f1" (the metrics' accuracy and f1, or None),
        "predictions": Predictions}."""
        import torch.distributed as dist

        mine = self.local()
        self.parts = []
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            every: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
        else:
            every = [mine]
        rows, labels, outputs = merge(every)
        if self.truth is not None:
            import numpy as np

            labels = np.asarray(self.truth, dtype=np.float64)[rows].reshape(labels.shape)
        preds = predictions(self.problem_type, rows, labels, outputs)
        values = metrics(preds, self.num_labels)
        return {
            "metrics": values,
            "scored": len(preds.row),
            "acc": values.get("accuracy"),
            "f1": values.get("f1"),
            "predictions": preds,
        }


def merge(parts: list[tuple[Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """The ranks' (rows, labels, outputs) as one split: repeats (row < 0) dropped, each row once, by row."""
    import numpy as np

    rows = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    outputs = np.concatenate([p[2] for p in parts])
    keep = rows >= 0
    rows, labels, outputs = rows[keep], labels[keep], outputs[keep]
    rows, first = np.unique(rows, return_index=True)  # sorted, the first copy of each row
    return rows, labels[first], outputs[first]


def predictions(problem_type: str, rows: Any, labels: Any, outputs: Any) -> Predictions:
    import numpy as np

    if problem_type == "regression":
        value = outputs[:, 0]
        return Predictions(problem_type, rows, labels, value, value)
    if problem_type == "multi_label":
        probs = 1 / (1 + np.exp(-outputs))
        return Predictions(problem_type, rows, labels.astype(np.int64), (outputs > 0).astype(np.int64), probs)
    shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True)) if len(outputs) else outputs
    probs = shifted / shifted.sum(axis=1, keepdims=True) if len(outputs) else shifted
    pred = outputs.argmax(axis=1) if len(outputs) else np.zeros(0, np.int64)
    score = probs[np.arange(len(pred)), pred] if len(pred) else np.zeros(0)
    return Predictions(problem_type, rows, labels.astype(np.int64), pred.astype(np.int64), score)


def metrics(p: Predictions, num_labels: int) -> dict[str, float | None]:
    """Every metric of the problem type (TASKS[...].metrics; `f1` for two classes only)."""
    if p.problem_type == "regression":
        return {
            "pearson": pearson(p.label, p.prediction),
            "spearman": spearman(p.label, p.prediction),
            "mse": mse(p.label, p.prediction),
        }
    if p.problem_type == "multi_label":
        return {
            "micro_f1": multilabel_micro_f1(p.label, p.prediction),
            "macro_f1": multilabel_macro_f1(p.label, p.prediction),
        }
    out = {
        "accuracy": accuracy(p.label, p.prediction),
        "macro_f1": macro_f1(p.label, p.prediction, num_labels),
        "f1": binary_f1(p.label, p.prediction) if num_labels == 2 else None,
        "mcc": mcc(p.label, p.prediction, num_labels),
    }
    return {k: v for k, v in out.items() if k in TASKS[p.problem_type].metrics and (k != "f1" or num_labels == 2)}


def resolve_primary(problem_type: str, chosen: str, num_labels: int) -> str:
    """The job's primary metric once the problem type is known; SpecError when it cannot be scored."""
    from training.spec import SpecError

    metric = primary_metric(problem_type, chosen)
    problem = metric_problem(problem_type, metric)
    if problem is None and metric == "f1" and num_labels != 2:
        problem = f"'f1' is the F1 of class 1 of two classes; this data has {num_labels}: use macro_f1"
    if problem:
        raise SpecError(f"data.primary_metric = {problem}")
    return metric


def better(metric: str, value: float | None) -> float:
    """A value for `max` to pick the best epoch by: higher is better, a missing value worst of all."""
    if value is None or math.isnan(value):
        return -sys.float_info.max  # finite: the HF Trainer's first best is -inf, and must be beaten
    return -value if metric in LOWER_IS_BETTER else value


def accuracy(label: Any, pred: Any) -> float | None:
    return float((label == pred).mean()) if len(label) else None


def _confusion(label: Any, pred: Any, k: int) -> Any:
    import numpy as np

    k = max(k, int(label.max()) + 1 if len(label) else 0, int(pred.max()) + 1 if len(pred) else 0)
    return np.bincount(label * k + pred, minlength=k * k).reshape(k, k)  # [true, predicted]


def _f1(tp: Any, fp: Any, fn: Any) -> Any:
    import numpy as np

    denominator = 2 * tp + fp + fn
    return np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)


def macro_f1(label: Any, pred: Any, k: int) -> float | None:
    """Mean F1 over the classes that occur as a label or a prediction (scikit-learn's labels=None)."""
    if not len(label):
        return None
    c = _confusion(label, pred, k)
    tp = c.diagonal()
    fp, fn = c.sum(axis=0) - tp, c.sum(axis=1) - tp
    seen = (tp + fp + fn) > 0
    return float(_f1(tp, fp, fn)[seen].mean())


def binary_f1(label: Any, pred: Any) -> float | None:
    """F1 of class 1; 0 when class 1 is neither a label nor a prediction (scikit-learn's zero_division)."""
    if not len(label):
        return None
    tp = int(((pred == 1) & (label == 1)).sum())
    fp, fn = int(((pred == 1) & (label != 1)).sum()), int(((pred != 1) & (label == 1)).sum())
    return float(_f1(tp, fp, fn))


def mcc(label: Any, pred: Any, k: int) -> float | None:
    """Matthews correlation, multiclass (Gorodkin's R_K, as scikit-learn); 0 when it is undefined."""
    if not len(label):
        return None
    c = _confusion(label, pred, k).astype(float)
    t, p = c.sum(axis=1), c.sum(axis=0)
    n, correct = c.sum(), c.trace()
    cov_tp = correct * n - t @ p
    cov_pp, cov_tt = n * n - p @ p, n * n - t @ t
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / math.sqrt(cov_tt * cov_pp))


def pearson(x: Any, y: Any) -> float | None:
    """Pearson's r; None for fewer than two samples or a constant side (undefined)."""
    import numpy as np

    if len(x) < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(dx @ dx) * float(dy @ dy))
    if denominator == 0:
        return None
    return float(np.clip(float(dx @ dy) / denominator, -1.0, 1.0))


def ranks(x: Any) -> Any:
    """Ranks from 1, ties given their average rank (SciPy's rankdata, method='average')."""
    import numpy as np

    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.concatenate([[True], xs[1:] != xs[:-1]])
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.concatenate([first[1:], [len(x)]]) - 1
    out = np.empty(len(x))
    out[order] = (first[group] + last[group]) / 2 + 1
    return out


def spearman(x: Any, y: Any) -> float | None:
    return pearson(ranks(x), ranks(y)) if len(x) >= 2 else None


def mse(x: Any, y: Any) -> float | None:
    return float(((x - y) ** 2).mean()) if len(x) else None


def multilabel_micro_f1(label: Any, pred: Any) -> float | None:
    if not len(label):
        return None
    tp = int((label & pred).sum())
    fp, fn = int((pred & (1 - label)).sum()), int(((1 - pred) & label).sum())
    return float(_f1(tp, fp, fn))


def multilabel_macro_f1(label: Any, pred: Any) -> float | None:
    """Mean F1 over every class; a class that is neither a label nor a prediction scores 0 (scikit-learn)."""
    if not len(label):
        return None
    tp = (label & pred).sum(axis=0)
    fp, fn = (pred & (1 - label)).sum(axis=0), ((1 - pred) & label).sum(axis=0)
    return float(_f1(tp, fp, fn).mean())
