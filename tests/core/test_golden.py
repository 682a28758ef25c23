"""Every template x every shipped experiment, compared whole with a committed script."""

from __future__ import annotations

import difflib
import shutil
import subprocess

import pytest

from tests.support.golden import GOLDEN_DIR, cases, render_all

CASES = cases()


@pytest.mark.parametrize(("experiment", "template", "sets", "path"), CASES, ids=[p.stem for *_, p in CASES])
def test_rendered_script_matches_golden(experiment, template, sets, path):
    assert path.exists(), (
        f"missing golden file {path}; create it on purpose with: python -m tests.support.golden --update"
    )
    expected = path.read_text(encoding="utf-8")
    actual = render_all(experiment, template, sets)
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "golden", "rendered"))
        pytest.fail(f"{path.name} differs (regenerate with: python -m tests.support.golden --update)\n{diff}")


def test_every_golden_file_belongs_to_an_experiment():
    wanted = {path for *_, path in CASES}
    stale = [p.name for p in GOLDEN_DIR.glob("*.golden") if p not in wanted]
    assert not stale, f"golden files without an experiment: {stale}"


CONTAINER_GOLDEN = sorted(GOLDEN_DIR.glob("container_*__srun.golden"))


@pytest.mark.parametrize("path", CONTAINER_GOLDEN, ids=[p.stem for p in CONTAINER_GOLDEN])
def test_container_scripts_pass_shellcheck(path):
    """The container partials' scripts (apptainer and pyxis, each launcher) are clean shell: quoting of
    the mounts and the image holds. (The shipped experiments' scripts are linted by test_experiments.)"""
    assert len(CONTAINER_GOLDEN) == 6
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: apt-get install shellcheck (tests/cluster/up.sh installs it)"
    for check in (["bash", "-n", str(path)], [shellcheck, "--severity=style", "--shell=bash", str(path)]):
        done = subprocess.run(check, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
