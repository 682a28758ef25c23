"""manifest.json as jobgen writes it and reads it back (jobgen.run.store): the same document json reads
back, indented, with each job (and array) on a line of its own; and its journal replayed by its rule."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from jobgen.run.store import manifest_text

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)
ENTRY = st.dictionaries(st.text(), VALUES, max_size=5)
DOC = st.dictionaries(st.text(), VALUES, max_size=5).flatmap(
    lambda doc: st.fixed_dictionaries({"jobs": st.lists(ENTRY, max_size=4)}).map(lambda j: {**doc, **j})
)


@given(DOC)
def test_a_manifest_reads_back_as_written(doc: dict) -> None:
    text = manifest_text(doc)
    assert json.loads(text) == doc
    assert text.endswith("}\n")


@given(st.lists(ENTRY, min_size=1, max_size=5))
def test_each_job_is_one_line(jobs: list) -> None:
    lines = manifest_text({"schema": 1, "jobs": jobs, "arrays": jobs}).splitlines()
    rows = [json.loads(line.strip().rstrip(",")) for line in lines if line.startswith("    {")]
    assert rows == jobs + jobs


def _naive(doc: dict, change: dict) -> None:
    """The journal's rule as docs/contracts.md states it, entry by entry."""
    if_job_id = change.get("if_job_id")
    for entry in doc.get(change.get("key") or "jobs") or []:
        fields = change["updates"].get(entry["name"])
        if isinstance(fields, dict) and (
            not isinstance(if_job_id, dict) or entry.get("job_id") == if_job_id.get(entry["name"])
        ):
            entry.update(fields)


NAMES = st.sampled_from(["a", "b", "c", "d"])
IDS = st.none() | st.sampled_from(["1", "2"])
CHANGE = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["jobs", "arrays"]),
        "updates": st.dictionaries(NAMES, st.dictionaries(st.sampled_from(["state", "job_id"]), IDS) | st.none()),
        "if_job_id": st.none() | st.dictionaries(NAMES, IDS),
    }
)


@given(st.lists(st.fixed_dictionaries({"name": NAMES, "job_id": IDS}), max_size=6), st.lists(CHANGE, max_size=6))
def test_a_journal_replays_as_its_rule_says(entries: list, changes: list) -> None:
    """Replayed by name (linear in the journal), it gives what the rule gives entry by entry."""
    import copy

    from jobgen.run.store import _apply

    ours = {"jobs": copy.deepcopy(entries), "arrays": copy.deepcopy(entries)}
    theirs = copy.deepcopy(ours)
    named: dict = {}
    for change in changes:
        assert _apply(ours, change, named) is None
        _naive(theirs, change)
    assert ours == theirs
