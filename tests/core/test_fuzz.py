"""Property: no experiment file, however hostile, makes jobgen write a script that runs what the user
did not write; it is refused in one line, or its scripts lint clean and run only jobgen's commands.

The rule and the generators live in tests/support/fuzzing.py; bench/fuzz.py runs the same with 10,000+ cases.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from tests.support.fuzzing import Counts, experiments, lint, run_case, stub_dir

CASES = 600


def test_hostile_experiment_files(tmp_path: Path):
    assert shutil.which("shellcheck"), "shellcheck is missing: apt-get install shellcheck"
    stubs = stub_dir(tmp_path / "stubs")
    tally = Counts()

    @settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(experiments())
    def case(exp):
        doc, stem = exp
        run_case(doc, stem, tmp_path, stubs, tally)

    case()
    assert not lint(tally.scripts)
    counts = tally.counts
    # The generators must reach both outcomes, and scripts that get as far as python: else the rule
    # above holds for nothing.
    assert counts["refused"] > CASES // 4 and counts["accepted"] > CASES // 10, counts
    assert counts["accepted with a payload"] > 10 and counts["python reached"] > 10, counts
    assert counts["markers found"] == 0, counts
