"""What a job ran on (result.json's "ran_on"): read from the environment, nothing assumed."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from training.results import installed_packages, ran_on

pytestmark = pytest.mark.training


def test_packages_are_this_environment_as_pip_freeze_names_them(tmp_path: Path) -> None:
    out = ran_on(tmp_path / "no-driver")
    packages = out["packages"]
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==\S+", p) for p in packages), packages
    assert packages == sorted(set(packages), key=str.lower)
    names = [p.split("==")[0] for p in packages]
    assert len({n.lower().replace("_", "-") for n in names}) == len(names)  # each distribution once
    assert {n.lower() for n in names} == {d.metadata["Name"].lower() for d in metadata.distributions()}
    assert all(metadata.version(p.split("==")[0]) == p.split("==")[1] for p in packages)  # the one imported
    assert out["driver"] is None and out["python"].count(".") == 2


def _dist(folder: Path, name: str, version: str) -> str:
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(folder)


def test_a_distribution_on_the_path_twice_is_the_first_one(tmp_path: Path) -> None:
    # setuptools vendors zipp and packaging; a user site can hold an older copy of what the venv has
    first = _dist(tmp_path / "venv", "zipp", "3.23.0")
    _dist(tmp_path / "venv", "Foo-Bar", "2.0")
    later = _dist(tmp_path / "vendored", "zipp", "4.1.2")
    _dist(tmp_path / "vendored", "foo_bar", "1.0")
    assert installed_packages([first, later]) == ["Foo-Bar==2.0", "zipp==3.23.0"]
    assert installed_packages([later, first]) == ["foo_bar==1.0", "zipp==4.1.2"]


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version\n",
            "550.54.15",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build\n", "570.124.06"),
        ("", None),
        ("something else entirely\n", None),
    ],
)
def test_the_driver_version_is_read_from_the_driver(tmp_path: Path, text: str, version: str | None) -> None:
    driver = tmp_path / "version"
    driver.write_text(text)
    assert ran_on(driver)["driver"] == version
