"""The metric references, in a process of their own: scikit-learn and SciPy answer one JSON request per line.

scripts/bootstrap.sh installs both into .venv/reference, off the path of the tests and the ranks (with
SciPy importable, torchmetrics imports scipy.signal in every Lightning and Fabric rank); only this
process, which tests/training/test_metrics.py starts, puts that folder on its path.
Request: {"kind": "single_label" | "multi_label" | "regression", "label": [...], "prediction": [...]};
answer: {metric: value} with the keys of training.contract.TASKS (None where SciPy says NaN).
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / ".venv" / "reference"))

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402
from sklearn import metrics  # noqa: E402


def answer(req: dict) -> dict:
    y, p = np.array(req["label"]), np.array(req["prediction"])
    if req["kind"] == "regression":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = {
                "pearson": float(stats.pearsonr(y, p)[0]) if len(y) >= 2 else None,
                "spearman": float(stats.spearmanr(y, p)[0]) if len(y) >= 2 else None,
                "mse": float(metrics.mean_squared_error(y, p)),
            }
        return {k: None if v is None or math.isnan(v) else v for k, v in out.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ill-defined F1 of an absent class: 0, as documented
        if req["kind"] == "multi_label":
            return {
                "micro_f1": float(metrics.f1_score(y, p, average="micro")),
                "macro_f1": float(metrics.f1_score(y, p, average="macro")),
            }
        out = {
            "accuracy": float(metrics.accuracy_score(y, p)),
            "macro_f1": float(metrics.f1_score(y, p, average="macro")),
            "mcc": float(metrics.matthews_corrcoef(y, p)),
        }
        if req.get("classes") == 2:
            out["f1"] = float(metrics.f1_score(y, p, average="binary", pos_label=1))
        return out


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
