"""Values that are well-typed but absurd are refused at validation, by one rule per class:
every numeric key has an upper bound (from the schema), slurm.time has a longest limit."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.experiment import schema
from jobgen.experiment.config import MAX_TIME_DAYS

BASE = {"data": {"dataset": "builtin:synthetic"}, "train": {"model": "builtin:tiny"}}

NUMERIC = [
    (section, f)
    for section, cls in schema.SECTIONS.items()
    for f in dataclasses.fields(cls)
    if typing.get_type_hints(cls)[f.name] in (int, float)
]


def toml(tree: dict[str, dict[str, object]]) -> str:
    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    return "".join(f"[{s}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in keys.items()) for s, keys in tree.items())


def refused(runner, tmp_path: Path, tree: dict[str, dict[str, object]]) -> str:
    path = tmp_path / "exp.toml"
    path.write_text(toml(tree))
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_there_are_numeric_keys_in_every_section_that_counts():
    assert {s for s, _ in NUMERIC} >= {"slurm", "train", "data", "launch", "sweep"}


@pytest.mark.parametrize(("section", "field"), NUMERIC, ids=[f"{s}.{f.name}" for s, f in NUMERIC])
def test_every_numeric_key_has_a_bound_and_refuses_ten_to_the_thirty(runner, tmp_path: Path, section, field):
    assert field.metadata["max"] is not None, f"{section}.{field.name} has no upper bound: give its opt() a max"
    line = refused(runner, tmp_path, {**BASE, section: {**BASE.get(section, {}), field.name: 10**30}})
    assert f"{section}.{field.name}" in line and f"at most {field.metadata['max']}" in line


@pytest.mark.parametrize(("section", "field"), NUMERIC, ids=[f"{s}.{f.name}" for s, f in NUMERIC])
def test_every_numeric_key_accepts_its_bound(runner, tmp_path: Path, section, field):
    """The bound itself is valid (inclusive); cross-key rules may still refuse it, but not as out of range."""
    path = tmp_path / "exp.toml"
    path.write_text(toml({**BASE, section: {**BASE.get(section, {}), field.name: field.metadata["max"]}}))
    result = runner.invoke(main, ["validate", str(path)])
    assert "at most" not in result.output, result.output


def test_schema_shows_every_bound(runner):
    out = runner.invoke(main, ["schema"]).output
    for section, f in NUMERIC:
        row = next(line for line in out.splitlines() if line.startswith(f"{section}.{f.name} "))
        assert f"at most {f.metadata['max']}" in row, row


@pytest.mark.parametrize("time", ["99999999-00:00:00", f"{MAX_TIME_DAYS + 1}-0", "600000", "9000:00:00"])
def test_a_time_limit_over_a_year_is_refused(runner, tmp_path: Path, time: str):
    line = refused(runner, tmp_path, {**BASE, "slurm": {"time": time}})
    assert "slurm.time" in line and f"at most {MAX_TIME_DAYS}-00:00:00" in line


@pytest.mark.parametrize("time", [f"{MAX_TIME_DAYS}-00:00:00", "UNLIMITED", "30", "2-12", "48:00:00"])
def test_a_time_limit_up_to_a_year_passes(runner, tmp_path: Path, time: str):
    path = tmp_path / "exp.toml"
    path.write_text(toml({**BASE, "slurm": {"time": time}}))
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output


# --- train.model: a local path must exist, as data files must -----------------------------------------


@pytest.mark.parametrize("model", ["./no-such-model", "../gone", "/no/such/model", "~/no-such-jobgen-model", "a/b/c"])
def test_a_local_model_that_does_not_exist_is_refused(runner, tmp_path: Path, model: str):
    line = refused(runner, tmp_path, {**BASE, "train": {"model": model}})
    assert "train.model" in line and "no such model folder" in line and str(tmp_path) in line


def test_an_unknown_builtin_model_is_refused(runner, tmp_path: Path):
    line = refused(runner, tmp_path, {**BASE, "train": {"model": "builtin:huge"}})
    assert "train.model" in line and "builtin:tiny" in line


@pytest.mark.parametrize("model", ["distilbert-base-uncased", "org/name", "builtin:tiny", "./here", "org/local"])
def test_hub_names_builtins_and_existing_folders_pass(runner, tmp_path: Path, model: str):
    (tmp_path / "here").mkdir()
    (tmp_path / "org" / "local").mkdir(parents=True)
    path = tmp_path / "exp.toml"
    path.write_text(toml({**BASE, "train": {"model": model}}))
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_a_swept_model_path_is_checked_per_point(runner, tmp_path: Path):
    path = tmp_path / "exp.toml"
    path.write_text(toml(BASE) + '[sweep.grid]\n"train.model" = ["builtin:tiny", "./missing"]\n')
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1 and "train.model" in result.output and "./missing" in result.output, result.output


# --- slurm.extra must not ask again for what a [slurm] key asks for ------------------------------------

# [slurm] values that make resource_options() write every option it can.
EVERY_RESOURCE = {
    "nodes": 2,
    "gpus_per_node": 2,
    "gpu_type": "a100",
    "ntasks_per_node": 2,
    "mem": "8G",
    "partition": "p",
    "account": "a",
    "qos": "q",
    "constraint": "c",
    "exclusive": True,
}


def _written() -> set[str]:
    from jobgen.backends._slurm import resource_options
    from jobgen.experiment.config import as_dict

    return {flag for flag, _ in resource_options(as_dict(schema.SlurmSection(**EVERY_RESOURCE)))}


def test_every_option_jobgen_writes_has_its_key_and_every_synonym_a_target():
    from jobgen.backends._slurm import SAME_RESOURCE
    from jobgen.experiment.config import MANAGED_FLAGS

    assert _written() <= set(MANAGED_FLAGS), "an option resource_options() writes has no [slurm] key in MANAGED_FLAGS"
    assert set(SAME_RESOURCE.values()) <= _written()


def _clash_cases() -> list[tuple[str, object, str]]:
    from jobgen.backends._slurm import SAME_RESOURCE
    from jobgen.experiment.config import MANAGED_FLAGS

    cases = [(flag, True if flag == "exclusive" else "1", MANAGED_FLAGS[flag]) for flag in sorted(_written())]
    value = {"gres": "gpu:a100:4", "mem-per-cpu": "4G", "mem-per-gpu": "4G"}
    return cases + [(f, value.get(f, "1"), MANAGED_FLAGS[target]) for f, target in sorted(SAME_RESOURCE.items())]


@pytest.mark.parametrize(("flag", "value", "key"), _clash_cases(), ids=[c[0] for c in _clash_cases()])
def test_an_extra_flag_that_asks_again_is_refused_naming_both_keys(runner, tmp_path: Path, flag, value, key):
    line = refused(runner, tmp_path, {**BASE, "slurm": {**EVERY_RESOURCE, "extra": {flag: value}}})
    assert "slurm.extra" in line and flag in line and key in line, line


@pytest.mark.parametrize(
    ("slurm", "extra"),
    [
        ({"gpus_per_node": 1}, {"gres": "nvme:1"}),  # another generic resource
        ({"gpus_per_node": 0}, {"gpus": "2"}),  # jobgen asks for no GPU: the extra flag asks once
        ({}, {"mem-per-cpu": "4G"}),  # slurm.mem unset
        ({"gpus_per_node": 1}, {"gres": False, "mail-type": "END"}),  # false leaves the flag out
    ],
)
def test_an_extra_flag_for_something_else_passes(runner, tmp_path: Path, slurm, extra):
    path = tmp_path / "exp.toml"
    path.write_text(toml({**BASE, "slurm": {**slurm, "extra": extra}}))
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_partition_counts_are_bounded_as_max_samples_is(runner, tmp_path: Path):
    line = refused(runner, tmp_path, {**BASE, "data": {**BASE["data"], "partition": [10**30, 5, 5]}})
    assert "data.partition" in line and "at most" in line
