"""Accuracy (and F1 for binary tasks) with torchmetrics; compute() reduces over all ranks."""

from __future__ import annotations

from typing import Any


class Scores:
    def __init__(self, num_classes: int, device: Any = "cpu") -> None:
        import torchmetrics

        self.binary = num_classes == 2
        metrics = {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)}
        if self.binary:
            metrics["f1"] = torchmetrics.F1Score(task="binary")
        self.collection = torchmetrics.MetricCollection(metrics).to(device)

    def update(self, logits: Any, labels: Any) -> None:
        preds = logits.argmax(dim=-1)
        self.collection["acc"].update(preds, labels)
        if self.binary:
            self.collection["f1"].update(preds, labels)

    def compute(self) -> dict[str, float | None]:
        """Synchronised across processes by torchmetrics when a process group exists; then reset."""
        values = {k: float(v) for k, v in self.collection.compute().items()}
        self.collection.reset()
        return {"acc": values["acc"], "f1": values.get("f1")}
