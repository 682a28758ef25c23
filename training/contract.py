"""The training entrypoint's input contract: every `train` and `data` key of spec.json.

One description of each key (type, default, one-line doc, allowed values, checks) and the rules
between keys (which engine runs which strategy on how many ranks). The training code reads its spec
through these classes; jobgen builds its [train] and [data] sections, `jobgen schema` and its
validation from the same ones. Standard library only: the CLI imports it on a login node.

A key added here exists on both sides at once; tests/core/test_contract.py fails if anything reads a key
this module does not describe.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

ENGINES = ("torch", "lightning", "fabric", "hf_trainer")
FSDP_STRATEGIES = ("fsdp", "fsdp_offload")
DEEPSPEED_STRATEGIES = (
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
)
STRATEGIES = ("auto", "ddp", *FSDP_STRATEGIES, *DEEPSPEED_STRATEGIES)
# Strategies that split the model over ranks and so need more than one (offloading ones also run on one).
SHARDING_STRATEGIES = ("fsdp", "fsdp_offload", "deepspeed_stage_2", "deepspeed_stage_3")
# The plain loop runs on one device or DDP.
PLAIN_LOOP_STRATEGIES = ("auto", "ddp")
Precision = Literal["32-true", "16-mixed", "bf16-mixed", "bf16-true"]  # as Lightning and Fabric type it
PRECISIONS: tuple[Precision, ...] = ("32-true", "16-mixed", "bf16-mixed", "bf16-true")
ACCELERATORS = ("auto", "gpu", "cpu")
PADDINGS = ("dynamic", "max_length")
DATA_FORMATS = ("auto", "csv", "json", "parquet")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
WandbMode = Literal["offline", "online", "disabled"]  # as wandb.init types it
WANDB_MODES: tuple[WandbMode, ...] = ("offline", "online", "disabled")
SPLITS = ("train", "validation", "test")
TINY_MODEL = "builtin:tiny"  # built on the fly by training/model.py
TINY_DECODER = "builtin:tiny-decoder"  # a Llama-shaped decoder, built on the fly the same way
BUILTIN_MODELS = (TINY_MODEL, TINY_DECODER)
PEFT_METHODS = ("none", "lora")
# The linear layers LoRA can adapt in each built-in model (their blocks' layers), known without loading it.
BUILTIN_LINEAR = {
    TINY_MODEL: ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),
    TINY_DECODER: ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
# The classification heads peft trains in full under LoRA (task SEQ_CLS's modules_to_save), never adapts.
HEAD_MODULES = ("classifier", "score")
AUTO = "auto"


@dataclass(frozen=True)
class Task:
    """What a problem type means for every engine: the head's `problem_type` on the Hugging Face config
    (which picks the loss: cross-entropy, BCE with logits, MSE), the metrics scored and the default
    primary metric (training/metrics.py computes them)."""

    hf_problem_type: str
    metrics: tuple[str, ...]
    primary: str


# The one table of problem types. `f1` (F1 of class 1) is scored for two classes only.
TASKS: dict[str, Task] = {
    "single_label": Task("single_label_classification", ("accuracy", "macro_f1", "f1", "mcc"), "accuracy"),
    "multi_label": Task("multi_label_classification", ("micro_f1", "macro_f1"), "micro_f1"),
    "regression": Task("regression", ("pearson", "spearman", "mse"), "pearson"),
}
PROBLEM_TYPES = (AUTO, *TASKS)
METRICS = ("accuracy", "macro_f1", "f1", "mcc", "pearson", "spearman", "mse", "micro_f1")
LOWER_IS_BETTER = ("mse",)


def primary_metric(problem_type: str, chosen: str = AUTO) -> str:
    """The metric best-checkpoint selection and `jobgen summary` use: data.primary_metric, or the
    problem type's default."""
    return TASKS[problem_type].primary if chosen == AUTO else chosen


def metric_problem(problem_type: str, metric: str) -> str | None:
    """Why `metric` cannot be the primary metric of `problem_type`; None when it can."""
    if metric == AUTO or problem_type == AUTO or metric in TASKS[problem_type].metrics:
        return None
    return f"{metric!r} is not scored for {problem_type}; use one of {', '.join(TASKS[problem_type].metrics)}"


# data.preset = "glue/<task>": the GLUE tasks on the hub. GLUE's test labels are hidden, so the
# validation split is the test split and validation is carved from train (data.val_fraction, seeded).
GLUE_DATASET = "nyu-mll/glue"
_GLUE: dict[str, tuple[str, str, str, str]] = {  # task: text field, pair field, problem type, primary metric
    "cola": ("sentence", "", "single_label", "mcc"),
    "sst2": ("sentence", "", "single_label", "accuracy"),
    "mrpc": ("sentence1", "sentence2", "single_label", "f1"),
    "qqp": ("question1", "question2", "single_label", "f1"),
    "stsb": ("sentence1", "sentence2", "regression", "pearson"),
    "mnli": ("premise", "hypothesis", "single_label", "accuracy"),
    "qnli": ("question", "sentence", "single_label", "accuracy"),
    "rte": ("sentence1", "sentence2", "single_label", "accuracy"),
}


def _glue(task: str) -> dict[str, Any]:
    text, pair, problem_type, metric = _GLUE[task]
    values: dict[str, Any] = {
        "dataset": GLUE_DATASET,
        "config": task,
        "text_field": text,
        "text_pair_field": pair,
        "label_field": "label",
        "train_split": "train",
        "validation_split": "",
        "test_split": "validation",
        "problem_type": problem_type,
        "primary_metric": metric,
    }
    if task == "mnli":  # scored on both: the matched split is the test split, mismatched is also tested
        values |= {"test_split": "validation_matched", "extra_test_splits": ["validation_mismatched"]}
    return values


PRESETS: dict[str, dict[str, Any]] = {f"glue/{task}": _glue(task) for task in _GLUE}
# Upper bounds shared by the keys that count the same thing (here and in jobgen's [slurm] section): far
# above any real job, far below what would overflow a C int in Slurm or a tensor index.
MAX_NODES = 10_000
MAX_DEVICES = 64  # per node
MAX_STEPS = 10**9
MAX_SAMPLES = 10**12  # rows of a split


def opt(
    default: Any,
    doc: str,
    *,
    choices: tuple[str, ...] = (),
    min: float | None = None,
    max: float | None = None,
    kind: str = "",
) -> Any:
    """A field with its doc and checks. `min` and `max` bound a number (both inclusive; every numeric key
    has a `max`, so that a typo of 10**30 stops here, not in sbatch or the training loop). `kind` names
    a format check: one of KIND_CHECKS here, or one jobgen.experiment.config adds for its own sections
    (time, mem, ...)."""
    meta = {"doc": doc, "choices": choices, "min": min, "max": max, "kind": kind}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def is_fsdp(strategy: str) -> bool:
    return strategy in FSDP_STRATEGIES


def is_deepspeed(strategy: str) -> bool:
    return strategy in DEEPSPEED_STRATEGIES


_Choice = TypeVar("_Choice", bound=str)


def one_of(value: str, choices: tuple[_Choice, ...]) -> _Choice:
    """`value` typed as one of its key's `choices` (e.g. PRECISIONS), for libraries that type them as a
    Literal. The spec was validated already: a value outside them is a bug, not a user error."""
    for choice in choices:
        if value == choice:
            return choice
    raise ValueError(f"{value!r} is not one of {', '.join(choices)}")


@dataclass(frozen=True)
class Train:
    engine: str = opt(
        "lightning",
        "Training engine: plain PyTorch loop, Lightning Trainer, Fabric or transformers.Trainer.",
        choices=ENGINES,
    )
    strategy: str = opt("auto", "Distribution strategy.", choices=STRATEGIES)
    precision: str = opt("32-true", "Numeric precision.", choices=PRECISIONS)
    compile: bool = opt(False, "torch.compile the model (warm-up steps run before the timer).")
    compile_mode: str = opt("default", "torch.compile mode.", choices=COMPILE_MODES)
    warmup_compile_steps: int = opt(
        3, "Untimed steps that trigger compilation before timing starts.", min=0, max=10_000
    )
    accelerator: str = opt(
        "auto", "auto|gpu|cpu; cpu runs a GPU-shaped job on CPU with gloo (tests).", choices=ACCELERATORS
    )
    num_nodes: int = opt(0, "Nodes the engine uses; 0 = slurm.nodes (must equal it).", min=0, max=MAX_NODES)
    devices: int = opt(0, "Devices (ranks) per node; 0 = slurm.gpus_per_node, or 1.", min=0, max=MAX_DEVICES)
    model: str = opt(
        "distilbert-base-uncased", "Hugging Face model name, local path, builtin:tiny or builtin:tiny-decoder."
    )
    peft: str = opt(
        "none",
        "none = every weight trains; lora = LoRA adapters plus the classification head (docs/guides/lora.md).",
        choices=PEFT_METHODS,
    )
    lora_r: int = opt(8, "LoRA rank (train.peft = 'lora').", min=1, max=4096)
    lora_alpha: int = opt(16, "LoRA alpha: the adapters' update is scaled by lora_alpha / lora_r.", min=1, max=100_000)
    lora_dropout: float = opt(0.1, "Dropout on the LoRA adapters' input.", min=0, max=0.9)
    lora_target_modules: list[str] = opt(
        [],
        "Modules LoRA adapts, by name (e.g. ['q_proj', 'v_proj']); empty = peft's for the model type.",
        kind="modules",
    )
    gradient_checkpointing: bool = opt(
        False, "Recompute activations in the backward pass (non-reentrant): less memory, more compute."
    )
    epochs: int = opt(3, "Training epochs.", min=1, max=100_000)
    batch_size: int = opt(16, "Per-device training batch size.", min=1, max=1_000_000)
    eval_batch_size: int = opt(64, "Per-device evaluation batch size.", min=1, max=1_000_000)
    grad_accum: int = opt(1, "Gradient accumulation steps.", min=1, max=100_000)
    lr: float = opt(5e-5, "AdamW learning rate.", min=0, max=10.0)
    weight_decay: float = opt(0.01, "AdamW weight decay.", min=0, max=10.0)
    warmup_steps: int = opt(0, "Linear warm-up steps of the learning rate.", min=0, max=MAX_STEPS)
    warmup_ratio: float = opt(0.0, "Warm-up as a fraction of all steps (used when warmup_steps = 0).", min=0, max=1.0)
    seed: int = opt(42, "Random seed (data partition, init, shuffling).", min=0, max=2**32 - 1)
    deterministic: bool = opt(False, "Deterministic algorithms (slower).")
    num_workers: int = opt(2, "DataLoader worker processes per rank.", min=0, max=256)
    log_every_n_steps: int = opt(50, "Write a metrics row every N optimizer steps.", min=1, max=MAX_STEPS)
    max_steps: int = opt(0, "Stop after N optimizer steps; 0 = no limit.", min=0, max=MAX_STEPS)
    loggers: list[str] = opt(
        ["csv"], "Where metrics go: csv (metrics.csv, always written), tensorboard, wandb, mlflow.", kind="loggers"
    )
    wandb_mode: str = opt(
        "offline", "W&B on the nodes: offline (upload later with `jobgen sync`), online, disabled.", choices=WANDB_MODES
    )
    mlflow_uri: str = opt(
        "", "MLflow tracking URI; empty = $MLFLOW_TRACKING_URI on the node, else RUN/mlruns (a file store)."
    )
    save_predictions: bool = opt(
        False, "Write jobs/<job>/predictions.csv: row, label, prediction, score of every test sample."
    )

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices


@dataclass(frozen=True)
class Data:
    dataset: str = opt("", "Hub dataset (imdb, glue), builtin:synthetic, or empty to use `files`.")
    config: str = opt("", "Hub dataset configuration, e.g. mrpc.")
    files: dict[str, str] = opt(
        {}, "Local files by split: {train = 'a.csv', test = 'b.csv'} (relative to this file).", kind="files"
    )
    format: str = opt("auto", "Format of local files (auto = from the extension).", choices=DATA_FORMATS)
    encoding: str = opt("utf-8", "Text encoding of local files (e.g. latin-1).", kind="encoding")
    text_field: str = opt("text", "Column with the text (first sentence of a pair).")
    text_pair_field: str = opt("", "Column with the second sentence, for sentence-pair tasks.")
    label_field: str = opt("label", "Column with the label (ints, or strings mapped to ids).")
    train_split: str = opt("train", "Source split used for training.")
    validation_split: str = opt("", "Source split for validation; empty = carve val_fraction of train.")
    test_split: str = opt("test", "Source split used for the final test.")
    partition: list[int | float] = opt(
        [], "[train, val, test] sizes (or fractions) cut from all splits pooled.", kind="partition"
    )
    val_fraction: float = opt(
        0.1, "Share of train kept for validation when there is no validation split.", min=0, max=1.0
    )
    max_samples: int = opt(0, "Cap every split at N samples (quick runs); 0 = all.", min=0, max=MAX_SAMPLES)
    max_length: int = opt(512, "Truncate sequences to this many tokens.", min=8, max=1_048_576)
    padding: str = opt(
        "dynamic", "dynamic = pad each batch to its longest; max_length = pad all to max_length.", choices=PADDINGS
    )
    group_by_length: bool = opt(False, "Batch samples of similar length together (less padding).")
    preset: str = opt(
        "",
        "A known task filling the data keys left at their defaults: glue/<task> (cola, sst2, ...).",
        choices=("", *PRESETS),
    )
    problem_type: str = opt(
        AUTO, "single_label, multi_label or regression; auto = from the labels.", choices=PROBLEM_TYPES
    )
    primary_metric: str = opt(
        AUTO,
        "Metric that picks the best epoch and leads the summary; auto = the problem type's.",
        choices=(AUTO, *METRICS),
    )
    extra_test_splits: list[str] = opt([], "Further source splits scored like the test split (MNLI mismatched).")


SECTIONS: dict[str, type] = {"train": Train, "data": Data}


def suggest(word: str, options: Any, prefix: str = "") -> str:
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{prefix}{match[0]}'?)" if match else ""


def show(value: Any, width: int = 60) -> str:
    """A value for a message: its repr, cut short (a value may be a 5,000-character string)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _check_loggers(v: list[str]) -> str | None:
    bad = [name for name in v if name not in LOGGERS]
    if bad:
        return f"{show(bad[0])} is not one of {', '.join(LOGGERS)}{suggest(str(bad[0]), LOGGERS)}"
    return f"{v!r} names a logger twice" if len(set(v)) != len(v) else None


def _check_modules(v: list[str]) -> str | None:
    for name in v:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", name):
            return f"{show(name)} is not a module name (letters, digits, _ and dots, e.g. 'q_proj')"
    return f"{v!r} names a module twice" if len(set(v)) != len(v) else None


def _check_encoding(v: str) -> str | None:
    try:
        codecs.lookup(v)
    except LookupError:
        return f"{show(v)} is not a text encoding Python knows (e.g. utf-8, latin-1)"
    return None


def _check_partition(v: list[float]) -> str | None:
    if v and (len(v) != 3 or any(isinstance(x, bool) or x <= 0 for x in v)):
        return "give three positive sizes [train, val, test] (counts, or fractions that sum to at most 1)"
    counts = all(float(x).is_integer() and x >= 1 for x in v)
    if v and not counts and not all(x < 1 for x in v):
        return "give three counts (e.g. [35000, 5000, 10000]) or three fractions (e.g. [0.8, 0.1, 0.1]), not a mix"
    if v and counts and max(v) > MAX_SAMPLES:
        return f"counts must be at most {MAX_SAMPLES}, got {show(max(v))}"
    if v and not counts and sum(v) > 1.0 + 1e-9:
        return f"fractions sum to {sum(v):.3f}; they must sum to at most 1"
    return None


def _check_files(v: dict[str, str]) -> str | None:
    for role in v:
        if role not in SPLITS:
            return f"{show(role)} is not a split; use {', '.join(SPLITS)}{suggest(role, SPLITS)}"
    return None


KIND_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "loggers": _check_loggers,
    "modules": _check_modules,
    "encoding": _check_encoding,
    "partition": _check_partition,
    "files": _check_files,
}


def value_problem(value: Any, meta: Any, kinds: dict[str, Callable[[Any], str | None]] | None = None) -> str | None:
    """What is wrong with one (well-typed) value by its field's checks; None when nothing is.
    `kinds` adds format checks for kinds this module does not own."""
    choices = meta["choices"]
    if choices and value not in choices:
        return f"{show(value)} is not one of {', '.join(choices)}{suggest(str(value), choices)}"
    minimum, maximum = meta["min"], meta["max"]
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        return f"must be {bounds(meta)}, got {show(value)}"
    kind = meta["kind"]
    if kind:
        check: Callable[[Any], str | None] = KIND_CHECKS.get(kind) or (kinds or {})[kind]
        return check(value)
    return None


def bounds(meta: Any) -> str:
    """A numeric field's valid range in words ('positive and at most 64'); '' when it has none."""
    low, high = meta["min"], meta["max"]
    positive = low == 1 and not isinstance(low, float)  # an integer's 1 is "positive"; a float's 1.0 is not
    words = [] if low is None else ["positive" if positive else f"at least {low}" if low else "zero or more"]
    return " and ".join(words + ([] if high is None else [f"at most {high}"]))


def section_problems(section: str, values: Any) -> list[tuple[str, str]]:
    """(dotted key, problem) for every value of a Train or Data object its checks refuse."""
    out = []
    for f in dataclasses.fields(values):
        problem = value_problem(getattr(values, f.name), f.metadata)
        if problem:
            out.append((f"{section}.{f.name}", problem))
    return out


def shape_problems(t: Train) -> list[tuple[str, str]]:
    """(dotted key, problem) for engine/strategy/world-size combinations no engine can run. `t` has
    num_nodes and devices resolved (>= 1)."""
    out = []
    if t.engine == "torch" and t.strategy not in PLAIN_LOOP_STRATEGIES:
        out.append(
            (
                "train.strategy",
                f"{t.strategy!r} needs engine 'lightning', 'fabric' or 'hf_trainer'; the "
                "plain loop (engine 'torch') runs on one device or DDP ('auto' or 'ddp')",
            )
        )
    if t.world_size == 1 and t.strategy in SHARDING_STRATEGIES:
        out.append(
            (
                "train.strategy",
                f"{t.strategy!r} shards across devices but the job has one; use 'auto', "
                "more devices, or a *_offload DeepSpeed stage",
            )
        )
    heads = [name for name in t.lora_target_modules if name.rsplit(".", 1)[-1] in HEAD_MODULES]
    if t.peft == "lora" and heads:
        out.append(
            (
                "train.lora_target_modules",
                f"{t.lora_target_modules!r} names {heads[0]!r}, the classification head: LoRA never adapts it, "
                "it trains in full (peft's modules_to_save); leave it out",
            )
        )
    layers = BUILTIN_LINEAR.get(t.model, ())
    missing = [name for name in t.lora_target_modules if layers and name.rsplit(".", 1)[-1] not in layers]
    if t.peft == "lora" and missing and not heads:
        out.append(
            (
                "train.lora_target_modules",
                f"{t.lora_target_modules!r} names {missing[0]!r}, which {t.model} has not; its layers: "
                f"{', '.join(layers)}",
            )
        )
    if t.engine == "fabric" and is_deepspeed(t.strategy) and t.grad_accum > 1:
        out.append(
            (
                "train.grad_accum",
                f"{t.grad_accum} with engine 'fabric' and DeepSpeed is not supported; use "
                "engine 'lightning' or grad_accum = 1",
            )
        )
    return out


def with_preset(data: Data) -> Data:
    """`data` with its preset's values in the keys it left at their defaults (a key set to anything
    else is the user's and stays)."""
    if data.preset not in PRESETS:  # none, or one the checks refuse
        return data
    defaults = Data()
    changes = {k: v for k, v in PRESETS[data.preset].items() if getattr(data, k) == getattr(defaults, k)}
    return dataclasses.replace(data, **changes)


def data_problems(d: Data) -> list[tuple[str, str]]:
    """(dotted key, problem) for data keys that cannot go together (after the preset is applied)."""
    d = with_preset(d)
    out = []
    problem = metric_problem(d.problem_type, d.primary_metric)
    if problem:
        out.append(("data.primary_metric", problem))
    if d.extra_test_splits and (d.partition or d.dataset == "builtin:synthetic"):
        out.append(("data.extra_test_splits", "names a dataset's own splits; a pooled partition has none"))
    return out


def resolve_partition(sizes: list[int | float] | tuple[int | float, ...], rows: int) -> tuple[int, int, int]:
    """Counts from data.partition: counts as given; fractions of `rows` rounded down, and when the
    fractions add up to 1, train takes the rows that rounding left over (no row is dropped)."""
    if all(isinstance(n, int) or float(n).is_integer() and n >= 1 for n in sizes):
        train, val, test = (int(n) for n in sizes)
        return train, val, test
    val, test = (int(f * rows) for f in sizes[1:])
    train = rows - val - test if abs(sum(sizes) - 1) <= 1e-9 else int(sizes[0] * rows)
    return train, val, test


def accelerate_mixed_precision(precision: str, accelerator: str) -> str:
    """`accelerate launch --mixed_precision` for a precision: what the engine will run (fp16 autocast is
    GPU-only, so 16-mixed on CPU runs bf16)."""
    if precision == "16-mixed":
        return "bf16" if accelerator == "cpu" else "fp16"
    return "bf16" if precision == "bf16-mixed" else "no"
