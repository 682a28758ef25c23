"""Raw data -> train/validation/test splits -> tokenized DatasetDict, cached on disk.

Preparation runs under a file lock keyed by the data fingerprint: the first rank to arrive tokenizes
and saves, the others wait and load the saved copy. Ranks never tokenize (or hit the hub) all at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from training import model as model_lib
from training import synthetic
from training.spec import DataSpec, Spec, SpecError, resolve_partition

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

SYNTHETIC = "builtin:synthetic"
SPLITS = ("train", "validation", "test")
FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Prepared:
    """What every engine gets: tokenized splits, the label names and where to load the model from."""

    splits: DatasetDict
    label_names: list[str]
    model_source: str
    tokenizer: Any
    from_cache: bool


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def data_fingerprint(data: DataSpec, seed: int) -> str:
    """Identity of the raw splits: the data spec, the seed, and each local file's size and mtime."""
    files = {role: [path, *_stat(path)] for role, path in sorted(data.files.items())}
    fields = {k: v for k, v in asdict(data).items() if k not in ("padding", "group_by_length", "max_length")}
    return _hash({"data": fields, "files": files, "seed": seed})


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---- raw data -----------------------------------------------------------------------------------


def load_raw(spec: Spec) -> DatasetDict:
    """The dataset's own splits: builtin synthetic, local files, or a hub dataset (name + config)."""
    import datasets

    data = spec.data
    if data.dataset == SYNTHETIC:
        sizes = data.partition or synthetic.DEFAULT_SIZES
        counts = resolve_partition(sizes, sum(synthetic.DEFAULT_SIZES))  # fractions: of the default size
        total = sum(counts) if counts == tuple(sizes) else sum(synthetic.DEFAULT_SIZES)
        rows = synthetic.make_rows(total, seed=spec.train.seed, lengths=data.config or "short")
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    if data.dataset:
        return datasets.load_dataset(data.dataset, data.config or None)
    if not data.files:
        raise SpecError("data.dataset is empty and data.files names no files")
    fmt = data.format if data.format != "auto" else _guess_format(data.files)
    kwargs = {"encoding": data.encoding} if fmt in ("csv", "json") else {}
    if fmt == "csv" and any(p.endswith(".tsv") for p in data.files.values()):
        kwargs["sep"] = "\t"
    return datasets.load_dataset(
        fmt, data_files=dict(data.files), cache_dir=str(spec.cache_dir / "hf_datasets"), **kwargs
    )


def _guess_format(files: dict[str, str]) -> str:
    found = {FORMATS.get(Path(p).suffix.lower()) for p in files.values()}
    if len(found) != 1 or None in found:
        raise SpecError(f"cannot tell the format of {sorted(files.values())}: set data.format")
    return cast(str, found.pop())  # None was ruled out above


def make_splits(raw: DatasetDict, data: DataSpec, seed: int) -> DatasetDict:
    """train/validation/test: a seeded partition of all rows pooled, or the dataset's own splits."""
    import datasets

    raw = datasets.DatasetDict({k: v.filter(_has_text(data)) for k, v in raw.items()})
    # The synthetic set is one pool: it is always cut, by default into synthetic.DEFAULT_SIZES.
    sizes = data.partition or (synthetic.DEFAULT_SIZES if data.dataset == SYNTHETIC else ())
    if sizes:
        out = _partition(raw, sizes, seed)
    else:
        out = _own_splits(raw, data, seed)
    if data.max_samples:
        out = datasets.DatasetDict({k: _cap(v, data.max_samples, seed) for k, v in out.items()})
    return out


def _has_text(data: DataSpec) -> Any:
    fields = [f for f in (data.text_field, data.text_pair_field) if f]
    return lambda row: all(isinstance(row[f], str) and row[f] for f in fields) and row[data.label_field] is not None


def _partition(raw: DatasetDict, partition: list[int | float] | tuple[int | float, ...], seed: int) -> DatasetDict:
    import datasets

    ordered = [raw[k] for k in SPLITS if k in raw] + [raw[k] for k in raw if k not in SPLITS]
    pool = datasets.concatenate_datasets(ordered).shuffle(seed=seed)
    sizes = resolve_partition(partition, len(pool))
    if min(sizes) < 1:
        raise SpecError(f"data.partition {list(partition)} leaves an empty split ({list(sizes)} of {len(pool)} rows)")
    if sum(sizes) > len(pool):
        raise SpecError(f"data.partition {list(sizes)} needs {sum(sizes)} rows; the dataset has {len(pool)}")
    cuts = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    return datasets.DatasetDict({name: pool.select(range(cuts[i], cuts[i + 1])) for i, name in enumerate(SPLITS)})


def _own_splits(raw: DatasetDict, data: DataSpec, seed: int) -> DatasetDict:
    import datasets

    for role in (data.train_split, data.test_split, data.validation_split):
        if role and role not in raw:
            raise SpecError(f"split {role!r} not in the dataset; it has {sorted(raw)}")
    train = raw[data.train_split]
    if data.validation_split:
        validation = raw[data.validation_split]
    else:
        cut = train.train_test_split(test_size=data.val_fraction, seed=seed)
        train, validation = cut["train"], cut["test"]
    return datasets.DatasetDict({"train": train, "validation": validation, "test": raw[data.test_split]})


def _cap(ds: Dataset, n: int, seed: int) -> Dataset:
    # Shuffle before capping: some splits are sorted by label (IMDB's test split is).
    return ds if len(ds) <= n else ds.shuffle(seed=seed).select(range(n))


def label_names(splits: DatasetDict, label_field: str) -> list[str]:
    """Class names, sorted; string labels and int labels alike (ints keep their numeric order)."""
    feature = splits["train"].features[label_field]
    if hasattr(feature, "names"):
        return list(feature.names)
    values = {v for ds in splits.values() for v in ds[label_field]}
    return [str(v) for v in sorted(values)]


def label_ids(splits: DatasetDict, label_field: str, names: list[str]) -> DatasetDict:
    index = {name: i for i, name in enumerate(names)}
    return splits.map(lambda b: {"labels": [index[str(v)] for v in b[label_field]]}, batched=True)


# ---- tokenization -------------------------------------------------------------------------------


def tokenize(splits: DatasetDict, tokenizer: Any, data: DataSpec, num_proc: int | None = None) -> DatasetDict:
    """Batched tokenization (pairs tokenized as pairs); keeps a `length` column for length grouping."""

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        pair = batch[data.text_pair_field] if data.text_pair_field else None
        enc = tokenizer(batch[data.text_field], pair, truncation=True, max_length=data.max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return dict(enc)

    keep = {"labels"}
    drop = [c for c in splits["train"].column_names if c not in keep]
    return splits.map(encode, batched=True, remove_columns=drop, num_proc=num_proc)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save_atomically(splits: DatasetDict, meta: dict[str, Any], final: Path) -> None:
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    splits.save_to_disk(str(tmp))
    (tmp / "jobgen_meta.json").write_text(json.dumps(meta))
    os.replace(tmp, final)


def train_texts(train: Any, data: DataSpec) -> list[str]:
    """Every text of the training split (both sentences of a pair): what the tiny tokenizer learns."""
    texts = list(train[data.text_field])
    if data.text_pair_field:
        texts += list(train[data.text_pair_field])
    return texts


def prepare(spec: Spec) -> Prepared:
    """Tokenized splits for this spec, from the cache when another rank or run made them already."""
    from datasets import load_from_disk

    key = data_fingerprint(spec.data, spec.train.seed)
    with file_lock(spec.cache_dir / "locks" / f"{key}.lock"):
        raw: list[Any] = []  # loaded at most once, only on a cache miss

        def splits() -> DatasetDict:
            if not raw:
                raw.append(make_splits(load_raw(spec), spec.data, spec.train.seed))
            return raw[0]

        def corpus() -> tuple[list[str], list[str]]:
            return train_texts(splits()["train"], spec.data), label_names(splits(), spec.data.label_field)

        source = model_lib.resolve_source(spec, key, corpus)
        tokenizer = model_lib.load_tokenizer(source)
        tok_key = _hash([key, tokenizer_fingerprint(tokenizer), spec.data.max_length])
        final = spec.cache_dir / "tokenized" / tok_key
        hit = final.exists()
        if not hit:
            names = label_names(splits(), spec.data.label_field)
            encoded = tokenize(
                label_ids(splits(), spec.data.label_field, names),
                tokenizer,
                spec.data,
                num_proc=2 if len(splits()["train"]) > 20000 else None,
            )
            save_atomically(encoded, {"label_names": names}, final)
    meta = json.loads((final / "jobgen_meta.json").read_text())
    return Prepared(load_from_disk(str(final)), meta["label_names"], source, tokenizer, hit)
