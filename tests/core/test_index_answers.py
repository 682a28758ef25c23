"""The index never changes an answer: whatever happens to a run's records or to its index between two
commands (a record rewritten by rename or in place, in place keeping its size and mtime, damaged, removed
or made anew; the index deleted, cut short or overwritten), `status` and `summary` through the index say
exactly what they say of a copy of the run that has no index (new inodes: every record read afresh)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.facts import RETRIES_SCHEMA
from jobgen.record.index import INDEX
from tests.data.summary import synth

PAST_NS = 1_700_000_000 * 10**9  # written long ago: the index may keep what was read of it
JOBS = {f"job{i}": synth.FakeJob(f"job{i}", sweep={"train.lr": i}, state="COMPLETED") for i in range(3)}
FILES = ("result.json", "progress.json", "retries.json", "metrics.csv", "spec.json")


def _record(path: Path, variant: int) -> bytes:
    """A sound record of the job at `path`, one of three variants of the same size (so that a rewrite in
    place may keep the size: its stamp then differs by the ctime alone)."""
    name, job = path.name, JOBS[path.parent.name]
    if name == "result.json":
        doc = synth.result_json(job, "exp")
        doc["test_acc"] = (0.51, 0.62, 0.73)[variant]
        doc["times_s"]["train"] = (101.5, 202.5, 303.5)[variant]
    elif name == "progress.json":
        doc = {"epoch": variant, "epochs": 3, "batch": 7, "batches": 9, "step": 10 + variant}
    elif name == "retries.json":
        doc = {"schema": RETRIES_SCHEMA, "retries": variant, "limit": 2 + variant, "excluded": [f"n{variant + 1}"]}
    elif name == "metrics.csv":
        return f"epoch,step,split,loss,acc\n0,5,train,0.{variant}1,\n0,9,validation,0.5,0.{variant + 5}\n".encode()
    else:
        doc = {"schema": 1, "train": {"engine": "torch", "lr": (0.001, 0.003, 0.002)[variant]}, "slurm": {"time": "10"}}
    return json.dumps(doc).encode()


def _write(path: Path, data: bytes, how: str) -> None:
    """As a job writes a record (a new file renamed into place), as a hand edits one (in place), or in
    place with the mtime put back (a file system whose timestamps are too coarse to tell)."""
    if how == "rename":
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        os.utime(path, ns=(PAST_NS + 1, PAST_NS + 1))
        return
    before = path.stat().st_mtime_ns if path.exists() else PAST_NS
    with open(path, "ab") as fh:  # the same inode
        fh.truncate(0)
        fh.write(data)
    after = before if how == "in place, same mtime" else before + 1
    os.utime(path, ns=(after, after))


STEPS = st.one_of(
    # A rewrite always changes the record: to the next variant or the one after.
    st.tuples(
        st.just("rewrite"),
        st.sampled_from(sorted(JOBS)),
        st.sampled_from(FILES),
        st.sampled_from(["in place, same mtime", "in place", "rename"]),
        st.integers(1, 2),
    ),
    st.tuples(
        st.just("damage"),
        st.sampled_from(sorted(JOBS)),
        st.sampled_from(FILES),
        st.sampled_from(["cut short", "garbage", "empty", "a list"]),
    ),
    st.tuples(st.just("remove"), st.sampled_from(sorted(JOBS)), st.sampled_from(FILES)),
    st.tuples(st.just("index"), st.sampled_from(["delete", "cut short", "garbage"])),
    st.tuples(st.just("report")),  # it reads and keeps too
)


def _apply(run: Path, step: tuple, variants: dict[Path, int]) -> None:
    """Do one step to the run; `variants` holds the variant each record was last written as (0 at first)."""
    if step[0] == "report":
        return
    if step[0] == "index":
        index = run / INDEX
        if step[1] == "delete":
            index.unlink(missing_ok=True)
        elif step[1] == "cut short" and index.exists():
            os.truncate(index, index.stat().st_size // 2)
        else:
            index.write_bytes(b"\x00garbage" * 100)
        return
    path = run / "jobs" / step[1] / step[2]
    if step[0] == "remove":
        path.unlink(missing_ok=True)
    elif step[0] == "damage":
        damaged = {"garbage": b"\xff\xfe\x00zz", "empty": b"", "a list": b"[1, 2]"}
        data = _record(path, variants.get(path, 0))
        _write(path, data[: len(data) // 2] if step[3] == "cut short" else damaged[step[3]], "in place")
    else:
        variant = variants[path] = (variants.get(path, 0) + step[4]) % 3
        _write(path, _record(path, variant), step[3])


def _answers(runner, root: Path, run: Path, report: bool = False) -> tuple[str, str]:
    """What `status` and `summary --format json` say of the run, warnings included, with the root's path
    as ROOT: the same words of the run and of its copy. `report`: a report is made first."""
    if report:
        result = runner.invoke(main, ["--output-root", str(root), "report", str(run), "-o", str(root / "r.html")])
        assert result.exit_code == 0, result.output
    said = []
    for args in (["status", str(run)], ["summary", str(run), "--format", "json"]):
        result = runner.invoke(main, ["--output-root", str(root), *args])
        assert result.exit_code == 0, result.output
        said.append((result.stdout + "\n" + result.stderr).replace(str(root), "ROOT"))
    return said[0], said[1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(STEPS, min_size=1, max_size=8))
def test_the_index_never_changes_an_answer(runner, tmp_path_factory, plan: list[tuple]) -> None:
    base = tmp_path_factory.mktemp("answers")
    run = synth.write_run(base / "runs", "exp", JOBS.values())
    for name in JOBS:
        for record in FILES:
            (run / "jobs" / name / record).write_bytes(_record(run / "jobs" / name / record, 0))
    for path in run.rglob("*"):
        os.utime(path, ns=(PAST_NS, PAST_NS))
    _answers(runner, base / "runs", run)  # the index made
    variants: dict[Path, int] = {}
    for number, step in enumerate(plan):
        _apply(run, step, variants)
        copy_root = base / f"copy-{number}"
        copy = copy_root / "exp" / run.name
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns(INDEX))
        through_the_index = _answers(runner, base / "runs", run, report=step[0] == "report")
        assert through_the_index == _answers(runner, copy_root, copy), step
        assert "COMPLETED" in through_the_index[0] and '"rows"' in through_the_index[1]
