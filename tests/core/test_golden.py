"""Every template x every shipped experiment, compared whole with a committed script."""

from __future__ import annotations

import difflib

import pytest

from tests.golden import TEMPLATES, experiments, golden_path, render_all

CASES = [(exp, tpl) for exp in experiments() for tpl in TEMPLATES]


@pytest.mark.parametrize(("experiment", "template"), CASES, ids=[f"{e.stem}-{t}" for e, t in CASES])
def test_rendered_script_matches_golden(experiment, template):
    path = golden_path(experiment, template)
    assert path.exists(), f"missing golden file {path}; create it on purpose with: python -m tests.golden --update"
    expected = path.read_text(encoding="utf-8")
    actual = render_all(experiment, template)
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "golden", "rendered"))
        pytest.fail(f"{path.name} differs (regenerate with: python -m tests.golden --update)\n{diff}")


def test_every_golden_file_belongs_to_an_experiment():
    wanted = {golden_path(e, t) for e, t in CASES}
    stale = [p.name for p in golden_path(experiments()[0], TEMPLATES[0]).parent.glob("*.golden") if p not in wanted]
    assert not stale, f"golden files without an experiment: {stale}"
