"""jobgen.facts: the times every record and Slurm answer carry, read the same way everywhere."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.facts import aware_time


@pytest.fixture
def zone():
    """Set the process's time zone (TZ and tzset), and put it back."""
    before = os.environ.get("TZ")

    def set_zone(name: str) -> None:
        os.environ["TZ"] = name
        time.tzset()

    yield set_zone
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_slurms_naive_times_are_read_in_the_zone_of_the_moment(zone) -> None:
    """The same text read again after the zone changed is another instant: what is read once is kept by
    zone, never taken for another zone's."""
    zone("UTC")
    utc = aware_time("2026-07-01T12:00:00")
    zone("Asia/Tokyo")
    tokyo = aware_time("2026-07-01T12:00:00")
    zone("America/New_York")  # daylight saving time in July
    new_york = aware_time("2026-07-01T12:00:00")
    assert utc is not None and tokyo is not None and new_york is not None
    assert utc - tokyo == timedelta(hours=9)
    assert new_york - utc == timedelta(hours=4)
    zone("UTC")
    assert aware_time("2026-07-01T12:00:00") == utc


@given(st.datetimes(timezones=st.just(timezone.utc)))
def test_jobgens_utc_times_read_back_as_written(when: datetime) -> None:
    assert aware_time(when.isoformat()) == when
    assert aware_time(when.isoformat().replace("+00:00", "Z")) == when


@pytest.mark.parametrize("value", [None, 5, "", "yesterday", "2026-13-01T00:00:00", ["2026-01-01"]])
def test_anything_else_is_no_time(value: object) -> None:
    assert aware_time(value) is None
