"""Problem types, GLUE presets and predictions.csv through the entrypoint, on real engines.

Regression and multi-label data are local files built from the synthetic corpus (the target follows its
polarity, so a model that learns scores well); the GLUE presets read a local folder shaped as the hub's
nyu-mll/glue (a README naming each configuration's parquet files, class labels in the files' features),
so the hub code path runs without a network. predictions.csv must give back test_metrics exactly.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import run_entrypoint, run_here, subprocess_env, write_spec
from tests.training.test_metrics import Reference
from training import synthetic
from training.metrics import metrics, predictions

np = pytest.importorskip("numpy")

pytestmark = [pytest.mark.training, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def reference() -> Any:
    ref = Reference()
    yield ref
    ref.close()


def _corpus(n: int, seed: int) -> list[tuple[str, int]]:
    rows = synthetic.make_rows(n, seed=seed)
    return [(t, synthetic.LABELS.index(y)) for t, y in zip(rows["text"], rows["label"], strict=True)]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _read_predictions(path: Path, kind: str) -> tuple[Any, Any, Any, list[dict[str, str]]]:
    lines = list(csv.DictReader(path.open()))
    rows = np.array([int(r["row"]) for r in lines])
    if kind == "regression":
        label = np.array([float(r["label"]) for r in lines])
        return rows, label, np.array([float(r["prediction"]) for r in lines]), lines
    if kind == "multi_label":
        return rows, None, None, lines
    return rows, np.array([int(r["label"]) for r in lines]), np.array([int(r["prediction"]) for r in lines]), lines


def _recomputed(path: Path, kind: str, num_labels: int) -> dict[str, Any]:
    """test_metrics from predictions.csv alone, with the job's own formulas."""
    rows, label, pred, lines = _read_predictions(path, kind)
    if kind == "multi_label":
        label = np.zeros((len(lines), num_labels), np.int64)
        pred = np.zeros((len(lines), num_labels), np.int64)
        for i, r in enumerate(lines):
            label[i, [int(c) for c in r["label"].split()]] = 1
            pred[i, [int(c) for c in r["prediction"].split()]] = 1
    from training.metrics import Predictions

    return metrics(Predictions(kind, rows, label, pred, pred), num_labels)


def test_regression_is_inferred_scored_by_pearson_and_predictions_recompute(
    tmp_path: Path, cache_dir: Path, reference: Any
) -> None:
    """Float targets that are not whole numbers: regression (one output, MSE), Pearson picks the epoch."""
    rng = random.Random(5)
    rows = [{"text": t, "score": round(1.0 + 3.0 * y + rng.uniform(-0.5, 0.5), 3)} for t, y in _corpus(900, 1)]
    files = {
        "train": _jsonl(tmp_path / "train.jsonl", rows[:600]),
        "test": _jsonl(tmp_path / "test.jsonl", rows[600:]),
    }
    spec = write_spec(
        tmp_path / "job",
        cache_dir,
        train={"engine": "torch", "save_predictions": True, "epochs": 2},
        data={"dataset": "", "partition": [], "files": files, "label_field": "score", "val_fraction": 0.2},
    )
    result = run_here(spec)
    assert result["primary_metric"] == "pearson"
    assert set(result["test_metrics"]) == {"pearson", "spearman", "mse"}
    assert result["test_acc"] is None and result["val_acc_per_epoch"] == [] and result["epochs_done"] == 2
    assert result["test_metrics"]["pearson"] > 0.5, result["test_metrics"]  # an untrained head is near 0
    assert result["scored"] == {"validation": 120, "test": 300}
    path = tmp_path / "job" / "predictions.csv"
    got_rows, label, pred, _ = _read_predictions(path, "regression")
    assert got_rows.tolist() == list(range(300))  # the test file's own rows, each once, in order
    assert label.tolist() == [r["score"] for r in rows[600:]]
    assert _recomputed(path, "regression", 1) == result["test_metrics"]
    want = reference.ask(kind="regression", label=label.tolist(), prediction=pred.tolist())
    for key, value in want.items():
        assert result["test_metrics"][key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.slow
def test_multi_label_from_list_labels_on_lightning(tmp_path: Path, cache_dir: Path, reference: Any) -> None:
    """Lists of classes: multi-label (BCE), micro- and macro-F1 at 0.5; the head has one output per class."""
    rows = []
    for text, y in _corpus(1400, 2):
        tags = [synthetic.LABELS[y]] + (["movie"] if "movie" in text.split() else [])
        rows.append({"text": text, "tags": tags})
    files = {
        "train": _jsonl(tmp_path / "train.jsonl", rows[:1200]),
        "test": _jsonl(tmp_path / "test.jsonl", rows[1200:]),
    }
    spec = write_spec(
        tmp_path / "job",
        cache_dir,
        train={"engine": "lightning", "save_predictions": True, "epochs": 3},
        data={"dataset": "", "partition": [], "files": files, "label_field": "tags"},
    )
    result = run_here(spec)
    assert result["primary_metric"] == "micro_f1"
    assert set(result["test_metrics"]) == {"micro_f1", "macro_f1"}
    assert result["test_metrics"]["micro_f1"] > 0.75, result["test_metrics"]
    path = tmp_path / "job" / "predictions.csv"
    assert _recomputed(path, "multi_label", 3) == result["test_metrics"]
    names = ["movie", "negative", "positive"]  # the classes, sorted
    lines = list(csv.DictReader(path.open()))
    assert [sorted(names[int(c)] for c in r["label"].split()) for r in lines] == [
        sorted(r["tags"]) for r in rows[1200:]
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "devices"), [("torch", 3), ("hf_trainer", 2)])
def test_predictions_over_ranks_one_row_per_sample(
    engine: str, devices: int, tmp_path: Path, cache_dir: Path, reference: Any
) -> None:
    """601 test rows, evaluation batches of 16, 2 or 3 ranks: one line per sample, sorted, and the
    test metrics are the file's, exactly, and scikit-learn's."""
    spec = write_spec(
        tmp_path / "job",
        cache_dir,
        train={"engine": engine, "devices": devices, "save_predictions": True, "eval_batch_size": 16},
        data={"partition": [1200, 203, 601], "primary_metric": "mcc"},
    )
    result = run_entrypoint(spec, subprocess_env(), timeout=420)
    assert result["world_size"] == devices and result["primary_metric"] == "mcc"
    assert result["scored"] == {"validation": 203, "test": 601}
    path = tmp_path / "job" / "predictions.csv"
    rows, label, pred, lines = _read_predictions(path, "single_label")
    assert len(lines) == 601 and rows.tolist() == sorted(set(rows.tolist()))
    assert _recomputed(path, "single_label", 2) == result["test_metrics"]
    assert (
        result["test_metrics"]["accuracy"] == result["test_acc"] and result["test_metrics"]["f1"] == result["test_f1"]
    )
    assert set(pred.tolist()) == {0, 1} and result["test_metrics"]["mcc"] > 0  # not a constant guess
    assert all(0.5 <= float(r["score"]) <= 1.0 for r in lines)  # the predicted class' probability
    want = reference.ask(kind="single_label", label=label.tolist(), prediction=pred.tolist(), classes=2)
    for key, value in want.items():
        assert result["test_metrics"][key] == pytest.approx(value, abs=1e-6), key


# --- GLUE presets, against a local folder shaped as the hub's nyu-mll/glue ----------------------------------


def _glue_stand_in(root: Path) -> Path:
    """mnli (3 classes; validation_matched and validation_mismatched) and stsb (a float score), each
    config's splits as parquet files named in README.md, as on the hub; the test splits' labels are
    hidden (-1) there as here."""
    import datasets

    folder = root / "glue"
    rng = random.Random(3)
    words = "cat dog house tree river car road city sun rain".split()

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(4, 9)))

    nli = datasets.ClassLabel(names=["entailment", "neutral", "contradiction"])
    sizes = {"train": 300, "validation_matched": 61, "validation_mismatched": 47, "test_matched": 20}
    configs = []
    for split, n in sizes.items():
        rows: dict[str, list[Any]] = {"premise": [], "hypothesis": [], "label": [], "idx": []}
        for i in range(n):
            premise, label = sentence(), rng.randrange(3)
            hypothesis = premise if label == 0 else sentence() if label == 1 else "not " + premise
            rows["premise"].append(premise)
            rows["hypothesis"].append(hypothesis)
            rows["label"].append(-1 if split.startswith("test") else label)
            rows["idx"].append(i)
        features = datasets.Features(
            {
                "premise": datasets.Value("string"),
                "hypothesis": datasets.Value("string"),
                "label": nli,
                "idx": datasets.Value("int32"),
            }
        )
        (folder / "mnli").mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(folder / "mnli" / f"{split}.parquet"))
    configs.append(("mnli", list(sizes)))
    for split, n in {"train": 200, "validation": 53, "test": 10}.items():
        rows = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
        for i in range(n):
            a, b = sentence(), sentence()
            shared = len(set(a.split()) & set(b.split()))
            rows["sentence1"].append(a)
            rows["sentence2"].append(b)
            rows["label"].append(-1.0 if split == "test" else min(5.0, shared + rng.uniform(0, 0.9)))
            rows["idx"].append(i)
        (folder / "stsb").mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows).to_parquet(str(folder / "stsb" / f"{split}.parquet"))
    configs.append(("stsb", ["train", "validation", "test"]))
    yaml = ["---", "configs:"]
    for name, splits in configs:
        yaml += [f"- config_name: {name}", "  data_files:"]
        yaml += [f"  - split: {s}\n    path: {name}/{s}.parquet" for s in splits]
    (folder / "README.md").write_text("\n".join([*yaml, "---", ""]))
    return folder


@pytest.mark.slow
def test_glue_presets_mnli_matched_and_mismatched_and_stsb(tmp_path: Path, cache_dir: Path, reference: Any) -> None:
    folder = _glue_stand_in(tmp_path)
    train = {"engine": "fabric", "epochs": 1, "save_predictions": True}
    # The preset names the hub dataset; the stand-in replaces only that key (a user's key wins).
    mnli = write_spec(
        tmp_path / "mnli", cache_dir, train=train, data={"preset": "glue/mnli", "dataset": str(folder), "partition": []}
    )
    result = run_here(mnli)
    assert result["primary_metric"] == "accuracy"
    by_split = result["test_metrics_by_split"]
    assert set(by_split) == {"validation_matched", "validation_mismatched"}
    assert by_split["validation_matched"] == result["test_metrics"]
    assert set(result["test_metrics"]) == {"accuracy", "macro_f1", "mcc"}  # three classes: no binary f1
    assert result["scored"] == {"validation": 30, "test": 61, "test_validation_mismatched": 47}
    assert result["samples"]["train"] == 270  # validation carved from train (val_fraction 0.1), seeded
    lines = list(csv.DictReader((tmp_path / "mnli" / "predictions.csv").open()))
    assert [int(r["row"]) for r in lines] == list(range(61))  # the matched split's rows
    assert _recomputed(tmp_path / "mnli" / "predictions.csv", "single_label", 3) == result["test_metrics"]

    stsb = write_spec(
        tmp_path / "stsb", cache_dir, train=train, data={"preset": "glue/stsb", "dataset": str(folder), "partition": []}
    )
    result = run_here(stsb)
    assert result["primary_metric"] == "pearson"
    assert set(result["test_metrics"]) == {"pearson", "spearman", "mse"}
    assert result["scored"]["test"] == 53
    _, label, pred, _ = _read_predictions(tmp_path / "stsb" / "predictions.csv", "regression")
    want = reference.ask(kind="regression", label=label.tolist(), prediction=pred.tolist())
    for key, value in want.items():
        assert result["test_metrics"][key] == pytest.approx(value, abs=1e-6), key


def test_the_preset_fills_only_the_keys_left_at_their_defaults() -> None:
    from training import contract

    data = contract.with_preset(contract.Data(preset="glue/mrpc", text_pair_field="other", max_samples=50))
    assert (data.dataset, data.config, data.text_field) == ("nyu-mll/glue", "mrpc", "sentence1")
    assert data.text_pair_field == "other" and data.max_samples == 50  # the user's keys
    assert (data.test_split, data.validation_split, data.primary_metric) == ("validation", "", "f1")
    mnli = contract.with_preset(contract.Data(preset="glue/mnli"))
    assert mnli.test_split == "validation_matched" and mnli.extra_test_splits == ["validation_mismatched"]
    stsb = contract.with_preset(contract.Data(preset="glue/stsb"))
    assert (stsb.problem_type, stsb.primary_metric) == ("regression", "pearson")
    assert contract.data_problems(contract.Data(problem_type="regression", primary_metric="mcc")) == [
        ("data.primary_metric", "'mcc' is not scored for regression; use one of pearson, spearman, mse")
    ]


def test_predictions_of_every_kind_name_their_classes_and_scores() -> None:
    """The file's cells for each kind, from the pure functions (one row each)."""
    single = predictions("single_label", np.array([0]), np.array([2.0]), np.array([[0.0, 1.0, 3.0]]))
    assert single.prediction.tolist() == [2] and single.score[0] == pytest.approx(np.exp(3) / (1 + np.e + np.exp(3)))
    multi = predictions("multi_label", np.array([0]), np.array([[1.0, 0.0, 1.0]]), np.array([[2.0, -1.0, 0.0]]))
    assert multi.prediction.tolist() == [[1, 0, 0]]  # 0 is a probability of exactly 0.5: not above it


def test_the_problem_type_comes_from_the_labels() -> None:
    import datasets

    from training import data

    def kind(labels: list[Any]) -> str:
        return data.problem_type(datasets.DatasetDict({"train": datasets.Dataset.from_dict({"y": labels})}), "y")

    assert kind(["pos", "neg"]) == "single_label"
    assert kind([0, 3, 2]) == "single_label"
    assert kind([0.0, 1.0, 1.0]) == "single_label"  # whole floats are class ids
    assert kind([0.0, 2.5, 1.0]) == "regression"
    assert kind([["a"], ["a", "b"], []]) == "multi_label"


def test_a_primary_metric_the_data_cannot_score_is_refused_when_the_data_is_known() -> None:
    from training.metrics import resolve_primary
    from training.spec import SpecError

    assert resolve_primary("single_label", "auto", 3) == "accuracy"
    assert resolve_primary("regression", "auto", 1) == "pearson"
    with pytest.raises(SpecError, match="'f1' is the F1 of class 1 of two classes; this data has 3: use macro_f1"):
        resolve_primary("single_label", "f1", 3)
    with pytest.raises(SpecError, match="'mcc' is not scored for multi_label"):
        resolve_primary("multi_label", "mcc", 4)  # problem_type auto: known once the labels are read


def test_the_best_epoch_by_the_primary_metric_survives_a_resume() -> None:
    """Lower is better for mse; the first of equal epochs wins; an undefined value never does; the
    epochs' metrics travel in the checkpoint's counters."""
    from training.loop import best_epoch
    from training.results import Stats

    stats = Stats(primary_metric="mse")
    for value in (2.0, 0.5, 0.5, None):
        stats.add_validation({"metrics": {"mse": value, "pearson": None}, "acc": None, "scored": 3})
    restored = Stats(primary_metric="mse")
    restored.restore(json.loads(json.dumps(stats.state())))
    assert restored.epochs_validated() == 4 and restored.val_acc_per_epoch == []
    assert best_epoch(restored.val_primary()) == 1
    restored.primary_metric = "pearson"  # every epoch undefined: the first
    assert best_epoch(restored.val_primary()) == 0
