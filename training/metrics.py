"""Accuracy (and F1 for binary tasks) from counts; compute() sums the counts over all ranks.

Both scores are ratios of counts (accuracy = correct / scored; binary F1 = 2·tp / (2·tp + fp + fn),
class 1 positive, 0 when there is no positive at all), so one all_reduce of five integers gives
exactly the score of the whole split on any world size, as torchmetrics' micro accuracy and binary
F1 do (tests/training/test_metrics.py compares the two), without importing torchmetrics in the plain
loop's and the Trainer's ranks (about 1.5 s of CPU each).

Rows marked as repeats (a negative `row`, see training/loaders.py) are left out, and the number of
rows scored is reduced with the scores: every sample of a split counts exactly once on any world size.
"""

from __future__ import annotations

from typing import Any

CORRECT, SCORED, TP, FP, FN = range(5)


class Scores:
    def __init__(self, num_classes: int, device: Any = "cpu") -> None:
        import torch

        self.binary = num_classes == 2
        self.device = device
        self.counts = torch.zeros(5, dtype=torch.int64, device=device)

    def update(self, logits: Any, labels: Any, rows: Any = None) -> None:
        import torch

        preds = logits.argmax(dim=-1)
        labels = labels.to(preds.device)
        if rows is not None:
            keep = rows.to(preds.device) >= 0
            preds, labels = preds[keep], labels[keep]
        step = [(preds == labels).sum(), torch.tensor(labels.numel(), device=preds.device)]
        if self.binary:
            step += [(preds.eq(1) & labels.eq(1)).sum(), (preds.eq(1) & labels.eq(0)).sum()]
            step += [(preds.eq(0) & labels.eq(1)).sum()]
        else:
            step += [torch.zeros((), dtype=torch.int64, device=preds.device)] * 3
        self.counts += torch.stack([s.to(torch.int64) for s in step]).to(self.counts.device)

    def compute(self) -> dict[str, Any]:
        """The scores over every rank's rows (one all_reduce when a process group exists); then reset."""
        import torch.distributed as dist

        counts = self.counts.clone()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        correct, scored, tp, fp, fn = (int(v) for v in counts.tolist())
        self.counts.zero_()
        f1 = (2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0) if self.binary else None
        return {"acc": correct / scored if scored else 0.0, "f1": f1, "scored": scored}
