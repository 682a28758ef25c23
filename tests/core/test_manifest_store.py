"""manifest.json as jobgen writes it and reads it back (jobgen.record.store): the same document json reads
back, indented, with each job (and array) on a line of its own; and its journal replayed by its rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.record.store import manifest_text

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

    from jobgen.record.store import _apply

    ours = {"jobs": copy.deepcopy(entries), "arrays": copy.deepcopy(entries)}
    theirs = copy.deepcopy(ours)
    named: dict = {}
    for change in changes:
        assert _apply(ours, change, named) is None
        _naive(theirs, change)
    assert ours == theirs


# --- a command that read the run writes what it decided -------------------------------------------------


def _read_run(tmp_path):
    from jobgen.record.model import Run
    from tests.data.summary.synth import FakeJob, write_run

    run_dir = write_run(tmp_path, "exp", [FakeJob(name, state="RUNNING") for name in ("a", "b", "c")])
    return run_dir, Run.load(run_dir)


def _states(run_dir) -> dict:
    from jobgen.record.store import load_manifest

    return {e["name"]: (e["state"], e["job_id"]) for e in load_manifest(run_dir)["jobs"]}


def test_a_run_still_as_read_is_written_once_without_reading_it_again(tmp_path, monkeypatch) -> None:
    """status of 10,000 jobs: the manifest read is the one written, not read, replayed and folded again."""
    from jobgen.record import store

    run_dir, run = _read_run(tmp_path)
    reads = []
    real = store._read_manifest
    monkeypatch.setattr(store, "_read_manifest", lambda path: reads.append(path) or real(path))
    run.record({"a": {"state": "COMPLETED"}})
    run.record({"b": {"state": "FAILED", "exit_code": "1:0"}})  # a second write in the same command
    assert reads == []
    monkeypatch.undo()
    assert _states(run_dir) == {"a": ("COMPLETED", "4000"), "b": ("FAILED", "4001"), "c": ("RUNNING", "4002")}
    assert not list(run_dir.glob(".journal-*"))
    assert run.jobs[1].entry["exit_code"] == "1:0"
    # The run stands for the record as written: its digest is that of the bytes on disk.
    assert run.digest == store._digest((run_dir / "manifest.json").read_bytes())


def test_a_record_changed_since_it_was_read_keeps_both_changes(tmp_path) -> None:
    from jobgen.record import store
    from jobgen.record.model import Run

    run_dir, run = _read_run(tmp_path)
    Run.load(run_dir).record({"b": {"state": "FAILED"}})  # another command wrote first (a new manifest)
    store.update_jobs(run_dir, {"c": {"state": "CANCELLED"}})  # and a third one a journal line
    run.record({"a": {"state": "COMPLETED"}})
    assert _states(run_dir) == {"a": ("COMPLETED", "4000"), "b": ("FAILED", "4001"), "c": ("CANCELLED", "4002")}
    assert run.digest is None and run.jobs[0].entry["state"] == "COMPLETED"
    assert not list(run_dir.glob(".journal-*"))  # folded in


def test_a_job_requeued_since_it_was_read_keeps_its_new_state(tmp_path) -> None:
    """A status read before a requeue must not write the old job's end over the new job's queue."""
    from jobgen.record import store

    run_dir, run = _read_run(tmp_path)
    store.update_jobs(run_dir, {"a": {"job_id": "9000", "state": "PENDING"}})
    run.record({"a": {"state": "COMPLETED"}, "b": {"state": "COMPLETED"}})
    assert _states(run_dir)["a"] == ("PENDING", "9000") and _states(run_dir)["b"] == ("COMPLETED", "4001")


def test_a_full_disk_leaves_the_record_as_it_was(tmp_path, monkeypatch) -> None:
    from jobgen.errors import JobgenError
    from jobgen.record import store

    run_dir, run = _read_run(tmp_path)
    before = (run_dir / "manifest.json").read_bytes()

    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "atomic_write", full)
    with pytest.raises(JobgenError, match=r"manifest\.json: No space left on device; free space first"):
        run.record({"a": {"state": "COMPLETED"}})
    assert (run_dir / "manifest.json").read_bytes() == before and run.manifest.get("journal") is None


def test_a_nan_read_from_the_record_stays_a_nan(tmp_path) -> None:
    """A NaN written to the record (a swept value of a key of any type) is written again, NaN and all,
    when a later command records a change."""
    import math

    from jobgen.record import store
    from jobgen.record.model import Run

    run_dir, _ = _read_run(tmp_path)
    store.update_jobs(run_dir, {"a": {"sweep": {"x": float("nan")}}})
    store.compact(run_dir)
    run = Run.load(run_dir)
    run.record({"b": {"state": "COMPLETED"}})
    doc = json.loads((run_dir / "manifest.json").read_text())
    assert math.isnan(doc["jobs"][0]["sweep"]["x"]) and doc["jobs"][1]["state"] == "COMPLETED"


def test_a_nan_in_an_update_is_written_as_a_nan(tmp_path) -> None:
    run_dir, run = _read_run(tmp_path)
    run.record({"a": {"x": float("inf")}})
    run.record({"b": {"state": "COMPLETED"}})  # and every write after it, in the same command
    doc = json.loads((run_dir / "manifest.json").read_text())
    assert doc["jobs"][0]["x"] == float("inf") and doc["jobs"][1]["state"] == "COMPLETED"
