"""The train/data contract is described once (training/contract.py) and both sides follow it.

These tests fail when a key, a choice or a default exists on one side only: jobgen's loader, the
spec.json it writes, the training code's reader, and every attribute the training code reads.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from jobgen.errors import ConfigError, PlanError
from jobgen.experiment import config, schema
from jobgen.plan import plan
from jobgen.plan.render import RunInfo
from jobgen.plan.spec import build_spec
from training import contract
from training import spec as training_spec

REPO = Path(__file__).resolve().parents[2]


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _spec_through_jobgen(tmp_path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The spec.json jobgen writes for one experiment tree (the real loader, planner and writer)."""
    path = tmp_path / "exp.toml"
    path.write_text("")
    exp = config.build(raw, path=path)
    (job,) = plan.plan(exp)
    return build_spec(job, RunInfo("r1", tmp_path / "run"), tmp_path / "cache")


def test_both_sides_use_the_contracts_classes() -> None:
    assert schema.SECTIONS["train"] is contract.Train is training_spec.TrainSpec
    assert schema.SECTIONS["data"] is contract.Data is training_spec.DataSpec
    assert contract.SECTIONS == {"train": contract.Train, "data": contract.Data}


def test_the_spec_jobgen_writes_has_exactly_the_contracts_keys_and_defaults(tmp_path: Path) -> None:
    written = _spec_through_jobgen(tmp_path, {"data": {"dataset": "imdb"}})
    read = training_spec.from_dict(written)
    # Keys the planner resolves, or jobgen rewrites as absolute paths; everything else is the default.
    resolved = {"train": {"num_nodes": 1, "devices": 1}, "data": {"dataset": "imdb"}}
    for name, cls in contract.SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert set(written[name]) == set(fields), name
        for key, f in fields.items():
            expected = resolved[name].get(key, _default(f))
            assert written[name][key] == expected, f"{name}.{key}"
            assert getattr(getattr(read, name), key) == expected, f"{name}.{key}"


@pytest.mark.parametrize(
    ("section", "key", "choice"),
    [
        (s, f.name, c)
        for s, cls in contract.SECTIONS.items()
        for f in dataclasses.fields(cls)
        for c in f.metadata["choices"]
    ],
)
def test_every_choice_passes_both_sides(tmp_path: Path, section: str, key: str, choice: str) -> None:
    # Two devices and Lightning: every strategy and precision has a shape it runs in.
    train = {"engine": "lightning", "devices": 2, "accelerator": "gpu" if choice == "gpu" else "cpu"}
    if (section, key) == ("train", "engine"):
        train |= {"engine": choice, "strategy": "ddp"}
    raw = {"data": {"dataset": "imdb"}, "slurm": {"gpus_per_node": 2}, "train": train}
    raw[section] = {**raw.get(section, {}), key: choice}
    written = _spec_through_jobgen(tmp_path, raw)
    assert getattr(getattr(training_spec.from_dict(written), section), key) == choice


@pytest.mark.parametrize(
    ("section", "key"),
    [(s, f.name) for s, cls in contract.SECTIONS.items() for f in dataclasses.fields(cls) if f.metadata["choices"]],
)
def test_a_value_outside_the_choices_is_refused_by_both_sides(tmp_path: Path, section: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: 'nope' is not one of"):
        _spec_through_jobgen(
            tmp_path,
            {"data": {"dataset": "imdb"}, section: {key: "nope"}}
            | ({"data": {"dataset": "imdb", key: "nope"}} if section == "data" else {}),
        )
    good = _spec_through_jobgen(tmp_path, {"data": {"dataset": "imdb"}})
    good[section][key] = "nope"
    with pytest.raises(training_spec.SpecError, match=rf"{section}\.{key}: 'nope' is not one of"):
        training_spec.from_dict(good)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"engine": "torch", "strategy": "fsdp", "devices": 2}, "train.strategy = 'fsdp' needs engine"),
        ({"strategy": "deepspeed_stage_3"}, "train.strategy = 'deepspeed_stage_3' shards across devices"),
        (
            {"engine": "fabric", "strategy": "deepspeed_stage_2", "grad_accum": 2, "devices": 2},
            "train.grad_accum = 2 with engine 'fabric'",
        ),
        (
            {"peft": "lora", "lora_target_modules": ["q_proj", "classifier"]},
            "train.lora_target_modules = .* names 'classifier', the classification head",
        ),
    ],
)
def test_the_shape_rules_are_the_same_on_both_sides(tmp_path: Path, train: dict[str, Any], message: str) -> None:
    raw = {"data": {"dataset": "imdb"}, "train": {"accelerator": "cpu", **train}}
    with pytest.raises(PlanError, match=message):
        _spec_through_jobgen(tmp_path, raw)
    good = _spec_through_jobgen(tmp_path, {"data": {"dataset": "imdb"}})
    good["train"] |= {"accelerator": "cpu", **train}
    with pytest.raises(training_spec.SpecError, match=message):
        training_spec.from_dict(good)


def test_make_strategy_refuses_an_unknown_strategy() -> None:
    pytest.importorskip("lightning")
    from training.strategies import make_strategy

    t = contract.Train(strategy="deepspeed_stage_9", num_nodes=1, devices=2)  # past validation on purpose
    with pytest.raises(training_spec.SpecError, match="train.strategy: 'deepspeed_stage_9' is not one of auto, ddp"):
        make_strategy(t, "cpu", fabric=False)


def _attributes_read(path: Path) -> set[tuple[str, str]]:
    """(section, attribute) for every attribute the module reads off a train or data spec: `x.train.y`,
    `x.data.y`, and `v.y` where v was bound to `x.train`/`x.data` or annotated TrainSpec/DataSpec."""
    tree = ast.parse(path.read_text())
    found: set[tuple[str, str]] = set()
    names = {"TrainSpec": "train", "DataSpec": "data", "Train": "train", "Data": "data"}
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        bound: dict[str, str] = {}
        for arg in func.args.args + func.args.kwonlyargs:
            ann = arg.annotation
            label = ann.id if isinstance(ann, ast.Name) else getattr(ann, "value", None)
            if isinstance(label, str) and label in names:
                bound[arg.arg] = names[label]
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
                if node.value.attr in ("train", "data"):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            bound[target.id] = node.value.attr
                        elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                            pass
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
                for target, value in zip(getattr(node.targets[0], "elts", []), node.value.elts, strict=False):
                    if (
                        isinstance(target, ast.Name)
                        and isinstance(value, ast.Attribute)
                        and value.attr in ("train", "data")
                    ):
                        bound[target.id] = value.attr
        for node in ast.walk(func):
            if not isinstance(node, ast.Attribute):
                continue
            inner = node.value
            if (
                isinstance(inner, ast.Attribute)
                and inner.attr in ("train", "data")
                and isinstance(inner.value, ast.Name)
                and inner.value.id in ("spec", "self")
            ):
                found.add((inner.attr, node.attr))
            elif isinstance(inner, ast.Name) and inner.id in bound:
                found.add((bound[inner.id], node.attr))
    return found


def test_every_key_the_training_code_reads_is_in_the_contract() -> None:
    files = sorted((REPO / "training").rglob("*.py"))
    read = set().union(*(_attributes_read(p) for p in files))
    assert len(read) > 30, "the scan found too few reads to mean anything"
    known = {s: {f.name for f in dataclasses.fields(cls)} for s, cls in contract.SECTIONS.items()}
    known["train"].add("world_size")
    unknown = sorted(f"{s}.{a}" for s, a in read if a not in known[s] and not a.startswith("__"))
    assert not unknown, f"the training code reads keys the contract does not describe: {unknown}"
    # And the other way: a key nothing reads is a key the user sets for nothing.
    unread = sorted(f"{s}.{k}" for s, keys in known.items() for k in keys if (s, k) not in read)
    assert not unread, f"keys the training code never reads: {unread}"


def test_the_contract_imports_without_the_training_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys, training.contract, jobgen.experiment.schema; "
        "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'lightning', 'datasets')])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
