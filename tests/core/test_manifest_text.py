"""manifest.json as jobgen writes it (jobgen.run.store.manifest_text): the same document json reads
back, indented, with each job (and array) on a line of its own."""

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
