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
# Each sample's row in the source data (its position in its source split; in the pool's order when
# data.partition pools the splits): predictions.csv's `row`.
SOURCE_ROW = "jobgen_row"
LAYOUT = 2  # of the tokenized cache: bump when its columns change, so old caches are not read
FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Prepared:
    """What every engine gets: tokenized splits, the label names and where to load the model from."""

    splits: DatasetDict
    label_names: list[str]  # class names; ["value"] for regression (one output)
    model_source: str
    tokenizer: Any
    from_cache: bool
    problem_type: str = "single_label"  # a key of training.contract.TASKS, resolved from the labels

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def test_splits(self) -> list[str]:
        """The splits the best weights are scored on: "test", then data.extra_test_splits'."""
        return ["test", *sorted(k for k in self.splits if k.startswith(EXTRA_TEST))]


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


EXTRA_TEST = "test_"  # data.extra_test_splits' split "x" is prepared as "test_x"


def make_splits(raw: DatasetDict, data: DataSpec, seed: int) -> DatasetDict:
    """train/validation/test (and test_<name> for data.extra_test_splits): a seeded partition of all rows
    pooled, or the dataset's own splits. Every row carries its SOURCE_ROW."""
    import datasets

    offsets, at = {}, 0
    for name in [k for k in SPLITS if k in raw] + [k for k in raw if k not in SPLITS]:  # the pool's order
        offsets[name], at = at, at + len(raw[name])
    pooled = bool(data.partition or data.dataset == SYNTHETIC)
    raw = datasets.DatasetDict(
        {
            k: v.add_column(SOURCE_ROW, [i + (offsets[k] if pooled else 0) for i in range(len(v))]).filter(
                _has_text(data)
            )
            for k, v in raw.items()
        }
    )
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
    for role in data.extra_test_splits:
        if role not in raw:
            raise SpecError(f"data.extra_test_splits: split {role!r} not in the dataset; it has {sorted(raw)}")
    train = raw[data.train_split]
    if data.validation_split:
        validation = raw[data.validation_split]
    else:
        cut = train.train_test_split(test_size=data.val_fraction, seed=seed)
        train, validation = cut["train"], cut["test"]
    extra = {f"{EXTRA_TEST}{role}": raw[role] for role in data.extra_test_splits}
    return datasets.DatasetDict({"train": train, "validation": validation, "test": raw[data.test_split], **extra})


def _cap(ds: Dataset, n: int, seed: int) -> Dataset:
    # Shuffle before capping: some splits are sorted by label (IMDB's test split is).
    return ds if len(ds) <= n else ds.shuffle(seed=seed).select(range(n))


def problem_type(splits: DatasetDict, label_field: str) -> str:
    """From the labels: lists are multi_label, a float that is not a whole number makes regression,
    anything else is single_label (class names, ints, whole floats)."""
    feature = splits["train"].features[label_field]
    if hasattr(feature, "names"):
        return "single_label"
    values = [v for ds in splits.values() for v in ds[label_field]]
    if any(isinstance(v, list) for v in values):
        return "multi_label"
    if any(isinstance(v, float) and not v.is_integer() for v in values):
        return "regression"
    return "single_label"


def label_names(splits: DatasetDict, label_field: str, problem: str = "single_label") -> list[str]:
    """Class names, sorted; string labels and int labels alike (ints keep their numeric order).
    Multi-label: the classes of every list; regression: ["value"], its one output."""
    if problem == "regression":
        return ["value"]
    feature = splits["train"].features[label_field]
    inner = getattr(feature, "feature", None)  # a list of class labels
    if hasattr(feature, "names") or hasattr(inner, "names"):
        return list(getattr(feature, "names", None) or inner.names)  # type: ignore[union-attr]
    values: set[Any] = set()
    for ds in splits.values():
        for v in ds[label_field]:
            if problem == "multi_label":
                values.update(v if isinstance(v, list) else [v])
            else:
                values.add(v)
    try:
        return [str(v) for v in sorted(values)]
    except TypeError:  # mixed kinds: order by their text
        return sorted(str(v) for v in values)


def label_ids(splits: DatasetDict, label_field: str, names: list[str], problem: str = "single_label") -> DatasetDict:
    """The `labels` column the model trains on: class ids, multi-hot floats, or the float target.
    Class labels (datasets' ClassLabel, as GLUE's) hold the class id already; other values are names."""
    index = {name: i for i, name in enumerate(names)}
    feature = splits["train"].features[label_field]
    if hasattr(feature, "names") or hasattr(getattr(feature, "feature", None), "names"):
        index |= {str(i): i for i in range(len(names))}

    def one(v: Any) -> Any:
        if problem == "regression":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SpecError(f"data.problem_type = 'regression' needs numbers in {label_field!r}, got {v!r}")
            return float(v)
        if problem == "multi_label":
            hot = [0.0] * len(names)
            for item in v if isinstance(v, list) else [v]:
                hot[index[str(item)]] = 1.0
            return hot
        if isinstance(v, list):
            raise SpecError(f"{label_field!r} holds lists: set data.problem_type = 'multi_label'")
        return index[str(v)]

    return splits.map(lambda b: {"labels": [one(v) for v in b[label_field]]}, batched=True)


# ---- tokenization -------------------------------------------------------------------------------


def tokenize(splits: DatasetDict, tokenizer: Any, data: DataSpec, num_proc: int | None = None) -> DatasetDict:
    """Batched tokenization (pairs tokenized as pairs); keeps a `length` column for length grouping."""

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        pair = batch[data.text_pair_field] if data.text_pair_field else None
        enc = tokenizer(batch[data.text_field], pair, truncation=True, max_length=data.max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return dict(enc)

    keep = {"labels", SOURCE_ROW}
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

        def problem() -> str:
            chosen = spec.data.problem_type
            return problem_type(splits(), spec.data.label_field) if chosen == "auto" else chosen

        def corpus() -> tuple[list[str], list[str]]:
            return train_texts(splits()["train"], spec.data), label_names(splits(), spec.data.label_field, problem())

        source = model_lib.resolve_source(spec, key, corpus)
        tokenizer = model_lib.load_tokenizer(source)
        tok_key = _hash([key, tokenizer_fingerprint(tokenizer), spec.data.max_length, LAYOUT])
        final = spec.cache_dir / "tokenized" / tok_key
        hit = final.exists()
        if not hit:
            kind = problem()
            names = label_names(splits(), spec.data.label_field, kind)
            encoded = tokenize(
                label_ids(splits(), spec.data.label_field, names, kind),
                tokenizer,
                spec.data,
                num_proc=2 if len(splits()["train"]) > 20000 else None,
            )
            save_atomically(encoded, {"label_names": names, "problem_type": kind}, final)
    meta = json.loads((final / "jobgen_meta.json").read_text())
    return Prepared(load_from_disk(str(final)), meta["label_names"], source, tokenizer, hit, meta["problem_type"])
