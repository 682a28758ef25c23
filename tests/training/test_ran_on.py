"""What a job ran on (result.json's "ran_on"): read from the environment, nothing assumed."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from training.results import ran_on

pytestmark = pytest.mark.training


def test_packages_are_this_environment_as_pip_freeze_names_them(tmp_path: Path) -> None:
    out = ran_on(tmp_path / "no-driver")
    packages = out["packages"]
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==\S+", p) for p in packages), packages
    assert packages == sorted(set(packages), key=str.lower)
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    assert {p.split("==")[0].lower(): p.split("==")[1] for p in packages} == installed
    assert out["driver"] is None and out["python"].count(".") == 2


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
