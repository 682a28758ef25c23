"""Accuracy (and F1 for binary tasks) with torchmetrics; compute() reduces over all ranks.

Rows marked as repeats (a negative `row`, see training/loaders.py) are left out, and the number of
rows scored is reduced with the scores: every sample of a split counts exactly once on any world size.
"""

from __future__ import annotations

from typing import Any


class Scores:
    def __init__(self, num_classes: int, device: Any = "cpu") -> None:
        import torchmetrics
        from torchmetrics.aggregation import SumMetric

        self.binary = num_classes == 2
        metrics: dict[str, torchmetrics.Metric | torchmetrics.MetricCollection] = {
            "acc": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes),
            "scored": SumMetric(),
        }
        if self.binary:
            metrics["f1"] = torchmetrics.F1Score(task="binary")
        self.collection = torchmetrics.MetricCollection(metrics).to(device)

    def update(self, logits: Any, labels: Any, rows: Any = None) -> None:
        preds = logits.argmax(dim=-1)
        if rows is not None:
            keep = rows.to(preds.device) >= 0
            preds, labels = preds[keep], labels[keep]
        self.collection["scored"].update(float(labels.numel()))
        if labels.numel():
            self.collection["acc"].update(preds, labels)
            if self.binary:
                self.collection["f1"].update(preds, labels)

    def compute(self) -> dict[str, Any]:
        """Synchronised across processes by torchmetrics when a process group exists; then reset."""
        values = {k: float(v) for k, v in self.collection.compute().items()}
        self.collection.reset()
        return {"acc": values["acc"], "f1": values.get("f1"), "scored": int(round(values["scored"]))}
