"""How the suite hands its tests to pytest-xdist's workers (tests/conftest.py pick_unit)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ALONE, WAITING_ON_SLURM, pick_unit

TRAINING = ["tests/training/test_engines.py::a", "tests/slurm/test_jobs.py::b", "tests/core/test_cli.py::c"]
WAITING = [f"{path}::t" for path in WAITING_ON_SLURM]
PROBE = f"{ALONE[0]}::p"


def test_the_waiter_takes_the_longest_waiting_test_and_the_others_the_heaviest_training():
    units = [TRAINING[2], PROBE, WAITING[3], TRAINING[1], WAITING[0], TRAINING[0]]
    assert pick_unit(units, waiter=True) == WAITING[0]
    assert pick_unit(units, waiter=False) == TRAINING[1]  # HEAVY first, in collection order


def test_a_worker_out_of_its_kind_takes_the_other_kinds_shortest():
    assert pick_unit([TRAINING[0], TRAINING[2], PROBE], waiter=True) == TRAINING[2]
    assert pick_unit([WAITING[0], WAITING[5], PROBE], waiter=False) == WAITING[5]


@given(st.permutations([*TRAINING, *WAITING, PROBE]), st.lists(st.booleans(), min_size=20, max_size=20))
def test_every_unit_goes_out_once_and_the_alone_test_last(units: list[str], waiters: list[bool]):
    left, handed = list(units), []
    for waiter in waiters:
        unit = pick_unit(left, waiter)
        if unit is None:
            break
        left.remove(unit)
        handed.append(unit)
    assert sorted(handed) == sorted(units) and handed[-1] == PROBE


def test_the_waiters_are_none_below_three_workers_one_with_three_and_two_from_four():
    from tests.conftest import waiter_ids

    assert waiter_ids(0) == waiter_ids(2) == frozenset()
    assert waiter_ids(3) == {"gw0"}
    assert waiter_ids(4) == waiter_ids(8) == {"gw0", "gw1"}


def test_with_two_waiters_a_waiter_out_of_waiting_tests_takes_no_training():
    assert pick_unit([TRAINING[0], TRAINING[2]], waiter=True, own_only=True) is None
    assert pick_unit([TRAINING[0], PROBE], waiter=False, own_only=True) == TRAINING[0]
    assert pick_unit([PROBE], waiter=True, own_only=True) == PROBE  # whoever asks last
