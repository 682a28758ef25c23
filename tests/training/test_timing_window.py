"""The timing window's edges, the same in every engine (docs/contracts.md, "The timing window"): each
epoch's first batch is fetched before the clock opens, every later fetch is inside it; and the first
`warmup_compile_steps` batches of an attempt are warm-up whether the model is compiled or not."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.training.conftest import spec_dict
from training import loaders
from training.run import run
from training.spec import from_dict

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.training, pytest.mark.timeout(300)]

# The slow fetches: FIRST_S far above the tiny model's whole training time (10 batches: about 2 s on
# a loaded 2-core machine, where 1.5 s was once exceeded), SECOND_S inside the window.
FIRST_S, SECOND_S = 4.0, 1.0


@pytest.mark.parametrize("engine", ["torch", "lightning", "fabric", "hf_trainer"])
def test_the_epochs_first_fetch_is_outside_the_window_and_the_next_inside(
    engine: str, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each epoch's first training batch takes FIRST_S to fetch, its second SECOND_S: the window holds
    the second's fetch (2 epochs: >= 2 x SECOND_S) and not the first's (< 2 x SECOND_S + FIRST_S)."""
    fetched = {"n": 0}
    iterate, collate = loaders.TrainBatches.__iter__, loaders.Collator.__call__

    def batches(self: Any) -> Any:
        fetched["n"] = 0  # a new epoch
        yield from iterate(self)

    def slow(self: Any, rows: list[dict[str, Any]]) -> Any:
        if len(rows) == 32:  # training batches (evaluation's are 128 rows, or the last, shorter one)
            fetched["n"] += 1
            time.sleep({1: FIRST_S, 2: SECOND_S}.get(fetched["n"], 0.0))
        return collate(self, rows)

    monkeypatch.setattr(loaders.TrainBatches, "__iter__", batches)
    monkeypatch.setattr(loaders.Collator, "__call__", slow)
    job = tmp_path / engine
    spec = from_dict(spec_dict(job, cache_dir, train={"engine": engine}, data={"partition": [160, 40, 40]}))
    assert run(spec) == 0
    times = json.loads((job / "result.json").read_text())["times_s"]
    assert 2 * SECOND_S <= times["train"] < 2 * SECOND_S + FIRST_S, times


def _clock(compile: bool, warmup: int) -> Any:
    from training import timing
    from training.results import Stats

    stats = Stats()
    return stats, timing.TrainClock(
        stats, SimpleNamespace(train=SimpleNamespace(compile=compile, warmup_compile_steps=warmup))
    )


@pytest.mark.parametrize("compile", [False, True])
def test_eager_and_compiled_runs_time_the_same_batches(compile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without new graphs, a compiled run and its eager baseline leave out the same warm-up batches."""
    import torch

    from training import timing

    monkeypatch.setattr(timing, "graphs_compiled", lambda: 4)  # no batch compiles a new graph here
    stats, clock = _clock(compile, warmup=3)
    batch = {"labels": torch.zeros(5), "attention_mask": torch.ones(5, 8)}
    for _ in range(7):
        clock.open()
        clock.close(batch, 0)
    assert clock.local["timed_samples"] == 4 * 5 and clock.local["trained_samples"] == 7 * 5
    assert clock.local["timed_tokens"] == 4 * 40
    assert stats.times_s["warmup_compile"] > 0 and stats.times_s["train"] > 0


def test_a_batch_that_compiled_a_new_graph_is_warm_up_only_when_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from training import timing

    graphs = iter([1, 1, 1, 2])  # open, close of batch 1 (no new graph); open, close of batch 2 (a new one)
    monkeypatch.setattr(timing, "graphs_compiled", lambda: next(graphs))
    batch = {"labels": torch.zeros(2), "attention_mask": torch.ones(2, 4)}
    for compile, timed in ((True, 2), (False, 4)):
        graphs = iter([1, 1, 1, 2])
        _, clock = _clock(compile, warmup=0)
        for _ in range(2):
            clock.open()
            clock.close(batch, 0)
        assert clock.local["timed_samples"] == timed


def test_a_recompile_on_any_rank_makes_the_batch_warm_up_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 recompiles for its partial last batch; rank 0 compiled nothing but waited for it in the
    step's collectives: with the ranks' answer both count that batch as warm-up, not as training."""
    import torch

    from training import timing

    monkeypatch.setattr(timing, "graphs_compiled", lambda: 1)  # this rank (0) compiles nothing new
    batch = {"labels": torch.zeros(3), "attention_mask": torch.ones(3, 4)}
    asked: list[bool] = []
    for other_rank_compiled, timed in ((True, 3), (False, 6)):
        _, clock = _clock(True, warmup=0)
        clock.any_rank = lambda flag, other=other_rank_compiled: asked.append(flag) or flag or other
        clock.open()
        clock.close(batch, 0)  # batch 1: the other rank recompiles (or not)
        clock.any_rank = lambda flag: asked.append(flag) or flag
        clock.open()
        clock.close(batch, 0)  # batch 2: nobody compiles
        assert clock.local["timed_samples"] == timed
    assert asked == [False, False, False, False]  # asked every batch, with this rank's own answer
    _, eager = _clock(False, warmup=0)
    eager.any_rank = lambda flag: pytest.fail("an eager run asks nothing")  # type: ignore[func-returns-value]
    eager.open()
    eager.close(batch, 0)
