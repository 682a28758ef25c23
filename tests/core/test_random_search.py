"""[sweep.random]: reproducible for a seed, within bounds, the asked count, combined with grid and points,
and bad input in one line naming the key."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.experiment import config, random_search
from jobgen.plan.plan import plan, sweep_points

BASE = """
[experiment]
name = "rs"

[train]
engine = "lightning"
model = "builtin:tiny"

[data]
dataset = "builtin:synthetic"

[launch]
backend = "local"
"""

RANDOM = """
[sweep.random]
n = {n}
seed = {seed}
"train.lr" = {{ loguniform = [1e-5, 1e-3] }}
"train.batch_size" = {{ choice = [16, 32] }}
"train.warmup_ratio" = {{ uniform = [0.0, 0.2] }}
"train.epochs" = {{ int = [1, 3] }}
"""


def _load(tmp_path: Path, text: str) -> config.Experiment:
    path = tmp_path / "rs.toml"
    path.write_text(text)
    return config.load(path)


def _overrides(tmp_path: Path, n: int = 8, seed: int = 0, extra: str = "") -> list[dict[str, Any]]:
    exp = _load(tmp_path, BASE + RANDOM.format(n=n, seed=seed) + extra)
    return [overrides for _, overrides in sweep_points(exp)]


def test_same_seed_same_points_other_seed_other_points(tmp_path: Path):
    first = _overrides(tmp_path, seed=7)
    assert first == _overrides(tmp_path, seed=7)
    assert first != _overrides(tmp_path, seed=8)
    assert len(first) == 8 and all(
        set(p) == {"train.lr", "train.batch_size", "train.warmup_ratio", "train.epochs"} for p in first
    )


def test_the_points_are_pinned():
    """The documented sampling order, written down: a change to it changes every user's sweep."""
    table = {
        "n": 2,
        "seed": 0,
        "train.lr": {"loguniform": [1e-5, 1e-3]},
        "train.epochs": {"int": [1, 3]},
        "train.warmup_ratio": {"uniform": [0.0, 0.2]},
        "train.batch_size": {"choice": [16, 32]},
    }
    expected = [
        {"train.batch_size": 32, "train.epochs": 2, "train.lr": 1.20495e-05, "train.warmup_ratio": 0.193093},
        {"train.batch_size": 32, "train.epochs": 2, "train.lr": 0.000686228, "train.warmup_ratio": 0.165971},
    ]
    assert random_search.sample(table) == expected
    # the order the keys are written in does not matter: they are drawn sorted
    assert random_search.sample(dict(reversed(table.items()))) == expected


def test_raising_n_keeps_the_earlier_points(tmp_path: Path):
    assert _overrides(tmp_path, n=12)[:5] == _overrides(tmp_path, n=5)


bounds = st.tuples(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.floats(min_value=1e-9, max_value=1e6)
).map(lambda t: (t[0], t[0] + t[1]))
positive = st.tuples(st.floats(min_value=1e-12, max_value=1e3), st.floats(min_value=1.01, max_value=1e6)).map(
    lambda t: (t[0], t[0] * t[1])
)
ints = st.tuples(st.integers(-1000, 1000), st.integers(1, 1000)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), n=st.integers(1, 50), u=bounds, lu=positive, i=ints)
def test_every_sampled_value_is_within_its_bounds(seed: int, n: int, u: Any, lu: Any, i: Any):
    table = {
        "n": n,
        "seed": seed,
        "train.warmup_ratio": {"uniform": list(u)},
        "train.lr": {"loguniform": list(lu)},
        "train.epochs": {"int": list(i)},
        "train.batch_size": {"choice": [8, 16, 32]},
    }
    assert random_search.problems(table) == []
    points = random_search.sample(table)
    assert len(points) == n
    for p in points:
        assert u[0] <= p["train.warmup_ratio"] <= u[1] and isinstance(p["train.warmup_ratio"], float)
        assert lu[0] <= p["train.lr"] <= lu[1]
        assert i[0] <= p["train.epochs"] <= i[1] and type(p["train.epochs"]) is int
        assert p["train.batch_size"] in (8, 16, 32)
        # what lands in the spec has at most DIGITS significant digits (or is a bound itself)
        for key, (low, high) in (("train.lr", lu), ("train.warmup_ratio", u)):
            assert p[key] in (low, high) or float(f"{p[key]:.6g}") == p[key], (key, p[key])


def test_loguniform_is_spread_in_log_space():
    low, high = 1e-6, 1e-2
    values = [
        p["train.lr"] for p in random_search.sample({"n": 2000, "seed": 3, "train.lr": {"loguniform": [low, high]}})
    ]
    below = sum(v < math.sqrt(low * high) for v in values) / len(values)
    # about half below the geometric mean; a linear sampler puts ~1% there
    assert 0.45 < below < 0.55, below
    # and each decade gets about a quarter
    per_decade = [sum(10**d <= v < 10 ** (d + 1) for v in values) / len(values) for d in range(-6, -2)]
    assert all(0.2 < share < 0.3 for share in per_decade), per_decade


def test_uniform_and_choice_cover_their_range():
    points = random_search.sample({"n": 2000, "seed": 1, "a.x": {"uniform": [0.0, 1.0]}, "a.c": {"choice": ["p", "q"]}})
    assert 0.45 < sum(p["a.x"] < 0.5 for p in points) / 2000 < 0.55
    assert 0.45 < sum(p["a.c"] == "p" for p in points) / 2000 < 0.55
    ints = {p["a.i"] for p in random_search.sample({"n": 200, "seed": 1, "a.i": {"int": [1, 3]}})}
    assert ints == {1, 2, 3}


def test_random_times_grid_times_points(tmp_path: Path):
    grid = '\n[sweep.grid]\n"train.seed" = [1, 2, 3]\n'
    exp = _load(tmp_path, BASE + RANDOM.format(n=4, seed=0) + grid)
    jobs = plan(exp)
    assert len(jobs) == 4 * 3
    assert len({j.name for j in jobs}) == 12
    sampled = [{k: v for k, v in j.sweep.items() if k != "train.seed"} for j in jobs]
    assert sampled[0] == sampled[1] == sampled[2] != sampled[3]  # each random point gets every grid value
    assert [j.exp.train.lr for j in jobs[::3]] == [p["train.lr"] for p in random_search.sample(exp.sweep.random)]
    points = '\n[[sweep.points]]\nname = "a"\n"train.precision" = "32-true"\n\n[[sweep.points]]\nname = "b"\n'
    exp = _load(tmp_path, BASE + RANDOM.format(n=4, seed=0) + grid + points)
    jobs = plan(exp)
    assert len(jobs) == 2 * 4 * 3
    assert jobs[0].name.startswith("a_") and jobs[-1].name.startswith("b_")


def test_job_names_follow_the_grid_style(tmp_path: Path):
    exp = _load(
        tmp_path,
        BASE
        + '\n[sweep.random]\nn = 2\nseed = 0\n"train.epochs" = { int = [1, 3] }\n"train.lr" = { loguniform = [1e-5, 1e-3] }\n',
    )
    names = [j.name for j in plan(exp)]
    values = random_search.sample(exp.sweep.random)
    assert names == [f"epochs-{p['train.epochs']}_lr-{p['train.lr']}" for p in values]
    assert names == [j.name for j in plan(exp)]


def test_max_jobs_counts_random_points(tmp_path: Path, runner):
    path = tmp_path / "rs.toml"
    path.write_text(
        BASE + RANDOM.format(n=50, seed=0) + '\n[sweep]\nmax_jobs = 100\n[sweep.grid]\n"train.seed" = [1, 2, 3]\n'
    )
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1 and "150 jobs exceeds sweep.max_jobs = 100" in result.output, result.output


def test_dry_run_shows_the_random_points(tmp_path: Path, runner):
    path = tmp_path / "rs.toml"
    path.write_text(BASE + RANDOM.format(n=3, seed=0))
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    for p in random_search.sample(config.load(path).sweep.random):
        assert f"lr-{p['train.lr']}" in result.output


def test_set_refuses_a_sampled_key(tmp_path: Path, runner):
    path = tmp_path / "rs.toml"
    path.write_text(BASE + RANDOM.format(n=3, seed=0))
    result = runner.invoke(main, ["validate", str(path), "--set", "train.lr=1e-4"])
    assert result.exit_code == 1 and "the sweep sets 'train.lr'" in result.output, result.output


def _random(*lines: str, n: str = "n = 4") -> str:
    return BASE + "\n[sweep.random]\n" + n + "\n" + "\n".join(lines) + "\n"


LR = '"train.lr" = { loguniform = [1e-5, 1e-3] }'
# (id, text, words the one line must contain, text of the line it must cite, or None)
BAD = [
    (
        "unknown-key",
        _random('"train.lrr" = { uniform = [0.0, 1.0] }'),
        ['sweep.random."train.lrr"', "did you mean 'train.lr'"],
        '"train.lrr"',
    ),
    (
        "not-sweepable",
        _random('"launch.backend" = { choice = ["local"] }'),
        ['sweep.random."launch.backend"', "not a sweepable key"],
        '"launch.backend"',
    ),
    (
        "unknown-distribution",
        _random('"train.lr" = { logunifrom = [1e-5, 1e-3] }'),
        ['sweep.random."train.lr"', "did you mean 'loguniform'"],
        '"train.lr"',
    ),
    (
        "two-distributions",
        _random('"train.lr" = { uniform = [0.1, 0.2], int = [1, 2] }'),
        ['sweep.random."train.lr"', "give one"],
        '"train.lr"',
    ),
    (
        "not-a-table",
        _random('"train.lr" = [1e-5, 1e-3]'),
        ['sweep.random."train.lr"', "distribution table"],
        '"train.lr"',
    ),
    (
        "low-above-high",
        _random('"train.lr" = { uniform = [0.2, 0.1] }'),
        ['sweep.random."train.lr"', "low < high"],
        '"train.lr"',
    ),
    (
        "low-equals-high",
        _random('"train.warmup_ratio" = { uniform = [0.1, 0.1] }'),
        ['sweep.random."train.warmup_ratio"', "low < high"],
        '"train.warmup_ratio"',
    ),
    (
        "loguniform-zero",
        _random('"train.lr" = { loguniform = [0.0, 1e-3] }'),
        ['sweep.random."train.lr"', "low > 0"],
        '"train.lr"',
    ),
    (
        "loguniform-negative",
        _random('"train.lr" = { loguniform = [-1e-3, 1e-3] }'),
        ['sweep.random."train.lr"', "low > 0"],
        '"train.lr"',
    ),
    (
        "int-floats",
        _random('"train.epochs" = { int = [1.0, 3] }'),
        ['sweep.random."train.epochs"', "integers"],
        '"train.epochs"',
    ),
    (
        "int-bool",
        _random('"train.epochs" = { int = [true, 3] }'),
        ['sweep.random."train.epochs"', "integers"],
        '"train.epochs"',
    ),
    (
        "bounds-three",
        _random('"train.lr" = { uniform = [0.1, 0.2, 0.3] }'),
        ['sweep.random."train.lr"', "[low, high]"],
        '"train.lr"',
    ),
    (
        "bounds-strings",
        _random('"train.lr" = { uniform = ["a", "b"] }'),
        ['sweep.random."train.lr"', "finite numbers"],
        '"train.lr"',
    ),
    (
        "choice-empty",
        _random('"train.batch_size" = { choice = [] }'),
        ['sweep.random."train.batch_size"', "no values"],
        '"train.batch_size"',
    ),
    ("n-zero", _random(LR, n="n = 0"), ["sweep.random.n", "from 1 to 100000"], "n = 0"),
    ("n-huge", _random(LR, n="n = 1000001"), ["sweep.random.n", "from 1 to 100000"], "n = 1000001"),
    ("n-float", _random(LR, n="n = 2.5"), ["sweep.random.n", "integer"], "n = 2.5"),
    ("n-missing", _random(LR, n=""), ["sweep.random.n", "missing"], None),
    ("seed-negative", _random(LR, "seed = -1"), ["sweep.random.seed", "integer from 0"], "seed = -1"),
    ("nothing-to-sample", _random(), ["sweep.random.n", "nothing to sample"], "n = 4"),
    (
        "also-in-grid",
        _random(LR) + '\n[sweep.grid]\n"train.lr" = [1e-4]\n',
        ['sweep.random."train.lr"', "also set by sweep.grid"],
        '"train.lr" = {',
    ),
    (
        "header-form",
        BASE + '\n[sweep.random]\nn = 2\n\n[sweep.random."train.lr"]\nuniform = [0.3, 0.1]\n',
        ['sweep.random."train.lr"', "low < high"],
        '[sweep.random."train.lr"]',
    ),
    # values the key itself refuses, found from the bounds and choices whatever the seed draws
    (
        "uniform-for-an-int-key",
        _random('"train.epochs" = { uniform = [1.0, 3.0] }'),
        ['sweep.random."train.epochs"', "takes integers", "{ int = [low, high] }"],
        '"train.epochs"',
    ),
    (
        "choice-value-refused",
        _random('"train.precision" = { choice = ["bf16-mixed", "fp8"] }'),
        ['sweep.random."train.precision"', "choice value 'fp8'", "bf16-mixed"],
        '"train.precision"',
    ),
    (
        "choice-value-wrong-type",
        _random('"train.batch_size" = { choice = [16, "x"] }'),
        ['sweep.random."train.batch_size"', "choice value 'x'", "expected int"],
        '"train.batch_size"',
    ),
    (
        "bound-out-of-range",
        _random('"train.lr" = { uniform = [-1.0, 0.5] }'),
        ['sweep.random."train.lr"', "uniform value -1.0", "zero or more"],
        '"train.lr"',
    ),
    (
        "int-bound-out-of-range",
        _random('"train.epochs" = { int = [0, 3] }'),
        ['sweep.random."train.epochs"', "int value 0", "positive"],
        '"train.epochs"',
    ),
    # a point the values make impossible as a whole: the error names the point and the line that drew it
    (
        "sampled-point-refused",
        _random('"train.num_nodes" = { int = [2, 3] }'),
        ["sweep point 0 sampled by sweep.random (num_nodes-", "train.num_nodes = ", "slurm.nodes = 1"],
        None,
    ),
]


@pytest.mark.parametrize(("text", "words", "cited"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_random_search(tmp_path: Path, runner, text: str, words: list[str], cited: str | None):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    root = tmp_path / "runs"
    for argv in (["validate", str(path)], ["--output-root", str(root), "submit", str(path), "--dry-run"]):
        result = runner.invoke(main, argv)
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.output and lines[0].startswith("Error: "), result.output
        for word in words:
            assert word in lines[0], f"{word!r} not in {lines[0]!r}"
        if cited is not None:
            line = next(i for i, t in enumerate(text.splitlines(), start=1) if cited in t and i > 13)
            assert f"exp.toml:{line}: " in lines[0], (cited, lines[0])
        else:
            assert "exp.toml: " in lines[0], lines[0]
        assert not root.exists() or not any(root.rglob("*")), "a failed submit left files behind"


def test_the_docs_example_is_a_valid_random_search(tmp_path: Path):
    page = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "sweeps.md").read_text()
    section = page.split("## Random search", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    jobs = plan(_load(tmp_path, BASE + "\n" + example))
    assert len(jobs) == 8 and all(1e-5 <= j.exp.train.lr <= 1e-3 for j in jobs)


def test_schema_lists_sweep_random(runner):
    out = runner.invoke(main, ["schema"]).output
    assert "sweep.random" in out and "loguniform" in out
