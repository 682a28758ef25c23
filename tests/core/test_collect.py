"""jobgen.results.collect: one row per job, whatever state its files are in."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobgen.results import logs
from jobgen.results.collect import collect, collect_run, parse_result, read_best_val_acc
from jobgen.results.diagnose import LAST_LINE, find_cause
from jobgen.states import State
from tests.data.summary import synth
from tests.data.summary.synth import FAULTS, FakeJob, log, write_run


@pytest.mark.parametrize(("job", "state", "problem", "kind"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_fault_table(tmp_path: Path, job, state: State, problem: str, kind: str | None) -> None:
    [row] = collect_run(write_run(tmp_path, "exp", [job]))
    assert row.result is None
    assert row.state is state
    assert problem in row.problem
    assert (row.cause.kind if row.cause else None) == kind
    if row.cause:
        assert row.cause.hint
        assert row.cause.log.startswith("jobs/j/")


def test_finished_job_reads_every_field(tmp_path: Path) -> None:
    job = FakeJob("a", sweep={"train.strategy": "ddp"}, train_s=42.5, test_acc=0.91, requeue_count=2)
    run = write_run(tmp_path, "exp", [job])
    [row] = collect_run(run)
    r = row.result
    assert row.state is State.COMPLETED and row.problem is None and row.cause is None
    assert (r.engine, r.strategy, r.precision, r.compile) == (job.engine, job.strategy, job.precision, False)
    assert (r.nodes, r.devices_per_node, r.train_s, r.total_s) == (1, 2, 42.5, job.total_s)
    assert (r.test_acc, r.best_val_acc, r.test_f1, r.requeue_count) == (
        0.91,
        job.best_val_acc,
        job.test_f1,
        2,
    )
    assert row.sweep == {"train.strategy": "ddp"}
    # Queue wait from submit to start, the start being finished_at - times_s.total.
    assert row.queue_wait_s == pytest.approx(job.queue_s)


def test_requeues_count_resubmissions_under_a_new_job_id(tmp_path: Path) -> None:
    """Slurm's restart count (result.json) starts again when `jobgen requeue` had to resubmit a job."""
    run = write_run(tmp_path, "exp", [FakeJob("a", requeue_count=1), FakeJob("b", requeue_count=1)])
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["jobs"][0]["previous_job_ids"] = ["7", "9"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert [row.result.requeue_count for row in collect_run(run)] == [3, 1]


def test_a_valid_result_overrides_a_stale_failure_state(tmp_path: Path) -> None:
    [row] = collect_run(write_run(tmp_path, "exp", [FakeJob("a", state="SUBMITTED")]))
    assert row.state is State.COMPLETED


def test_live_state_wins_and_gives_the_start_time(tmp_path: Path) -> None:
    job = FakeJob("a", result=None, logs={"slurm-1.out": "epoch 1\n"})
    run = write_run(tmp_path, "exp", [job], run_id="r1")
    # jobgen.states's JobInfo: a State and Slurm's naive local start time as text.
    start = (synth.T0 + timedelta(seconds=90)).astimezone().replace(tzinfo=None)
    live = SimpleNamespace(state=State.RUNNING, start=start.isoformat())
    [row] = collect_run(run, {("r1", "a"): live})
    assert row.state is State.RUNNING
    assert row.cause is None and row.problem == "still running: no result yet"
    (run / "jobs" / "a" / "progress.json").write_text('{"epoch": 0, "epochs": 2, "batch": 5, "batches": 20}')
    [row] = collect_run(run, {("r1", "a"): live})
    assert row.problem == "still running: at epoch 1/2 25%"
    assert row.queue_wait_s == pytest.approx(90)


def test_start_time_recorded_by_status_beats_the_result_clock(tmp_path: Path) -> None:
    run = write_run(tmp_path, "exp", [FakeJob("a", queue_s=30)], run_id="r1")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["jobs"][0]["started_at"] = (synth.T0 + timedelta(seconds=45)).isoformat()
    (run / "manifest.json").write_text(json.dumps(manifest))
    [row] = collect_run(run)
    assert row.queue_wait_s == pytest.approx(45)


def test_live_final_state_keeps_the_log_cause(tmp_path: Path) -> None:
    job = FakeJob("a", result=None, logs={"slurm-1.out": log("oom.out")})
    run = write_run(tmp_path, "exp", [job], run_id="r1")
    [row] = collect_run(run, {("r1", "a"): State.FAILED})
    assert row.state is State.FAILED and row.cause.kind == "gpu_oom"
    assert row.queue_wait_s is None  # no result, no live start: unknown, not guessed


def test_unknown_result_fields_are_tolerated(tmp_path: Path) -> None:
    job = FakeJob("a")
    data = synth.result_json(job, "exp")
    data.update(test_acc="high", times_s=None, peak_memory_mb=[], finished_at="yesterday", extra={"x": 1})
    result = parse_result(json.loads(json.dumps(data)))
    assert result.test_acc is None and result.train_s is None and result.peak_gpu_mb is None
    assert result.best_val_acc == job.best_val_acc


def test_broken_manifest_is_one_reported_row(tmp_path: Path) -> None:
    good = write_run(tmp_path, "exp", [FakeJob("a")], run_id="good")
    bad = tmp_path / "exp" / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    rows = collect([bad, good, tmp_path / "nowhere"])
    assert [r.name for r in rows] == ["(manifest)", "a", "(manifest)"]
    assert "manifest.json unreadable" in rows[0].problem and rows[0].state is State.UNKNOWN


def test_spec_fills_the_configuration_of_a_job_without_result(tmp_path: Path) -> None:
    job = FakeJob("a", engine="fabric", strategy="fsdp", result=None, logs={"slurm-1.out": log("oom.out")})
    [row] = collect_run(write_run(tmp_path, "exp", [job]))
    assert row.train["engine"] == "fabric" and row.train["strategy"] == "fsdp"


def test_rank_labelled_exception_after_torchrun_wrapper(tmp_path: Path) -> None:
    (tmp_path / "slurm-1.out").write_text(
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]:   File 'x.py', line 1\n"
        "[rank1]: ValueError: labels must be 0 or 1\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED\n"
    )
    cause = find_cause(logs.files("sbatch", tmp_path), tmp_path)
    assert cause.kind == "exception" and cause.message == "ValueError: labels must be 0 or 1"


@pytest.mark.parametrize("last", ["out", "err"])
def test_of_one_jobs_out_and_err_the_one_written_last_says_why(tmp_path: Path, last: str) -> None:
    """A job's logs are listed in name order (.err before .out), but the diagnosis reads the stream
    written to last as the later one: its last line is why the job stopped."""
    import os

    said = {
        "out": "training: stopped: no space left for the checkpoint",
        "err": "fatal: the dataset cache is unreadable",
    }
    (tmp_path / "slurm-1.out").write_text(f"starting\n{said['out']}\n")
    (tmp_path / "slurm-1.err").write_text(f"{said['err']}\n")
    first = "err" if last == "out" else "out"
    os.utime(tmp_path / f"slurm-1.{first}", (1_000_000, 1_000_000))
    os.utime(tmp_path / f"slurm-1.{last}", (1_000_100, 1_000_100))
    paths = logs.files("sbatch", tmp_path)
    assert [p.name for p in paths] == ["slurm-1.err", "slurm-1.out"]  # by name, whichever is newer
    cause = find_cause(paths, tmp_path)
    assert (cause.kind, cause.message, cause.log) == (LAST_LINE, said[last], f"slurm-1.{last}")


def test_a_startup_timeout_setting_is_not_a_timeout(tmp_path: Path) -> None:
    (tmp_path / "slurm-1.out").write_text("NCCL INFO ProcessGroupNCCL initialized, TIMEOUT(ms): 600000\n")
    assert find_cause(logs.files("sbatch", tmp_path), tmp_path).kind == LAST_LINE


def test_only_the_log_tail_is_read(tmp_path: Path) -> None:
    # A cause far before the tail is history (e.g. an earlier attempt); the tail decides.
    (tmp_path / "slurm-1.out").write_text("CUDA out of memory\n" + "x" * 400_000 + "\nall good\n")
    assert (
        find_cause(logs.files("sbatch", tmp_path), tmp_path).kind,
        find_cause(logs.files("sbatch", tmp_path), tmp_path).message,
    ) == (LAST_LINE, "all good")


def test_a_clean_one_line_error_is_shown_as_the_last_log_line(tmp_path: Path) -> None:
    error = "training: unknown key spec.slurm. Valid: cache_dir, data"
    job = FakeJob("j", state="FAILED", result=None, logs={"local.out": f"starting\n{error}\n"})
    [row] = collect_run(write_run(tmp_path, "exp", [job]))
    assert row.state is State.FAILED and row.problem == f"last log line: {error}"


def test_progress_in_the_log_of_a_submitted_job_is_not_a_failure(tmp_path: Path) -> None:
    # The training's progress line and heartbeat (training/progress.py) say where it is, not what it said.
    log = "training: data for j ready: train 10\ntraining: epoch 1/2 50% step 5/10\ntraining: testing, 12 s so far\n"
    job = FakeJob("j", state="SUBMITTED", result=None, logs={"slurm-1.out": log})
    [row] = collect_run(write_run(tmp_path, "exp", [job]))
    assert row.state is State.SUBMITTED
    assert row.problem == "still running: no result yet; last log line: training: data for j ready: train 10"


def test_metrics_csv_best_val_acc(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,epoch,val_acc\n10,0,\n20,0,0.7\n30,1,0.8\n40,1,junk\n")
    assert read_best_val_acc(path) == pytest.approx(0.8)
    assert read_best_val_acc(tmp_path / "none.csv") is None


def test_metrics_csv_long_format(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text(
        "epoch,step,split,loss,acc,f1\n0,10,train,0.7,,\n0,63,validation,,0.91,0.9\n"
        "1,126,validation,,0.95,0.94\n2,126,test,,0.99,0.99\n"
    )
    assert read_best_val_acc(path) == pytest.approx(0.95)


def test_an_unfinished_job_shows_its_validation_accuracy_so_far(tmp_path: Path) -> None:
    from jobgen.results.summary import summarize

    job = FakeJob("j", state="TIMEOUT", result=None, logs={"slurm-1.out": log("time_limit.out")})
    run = write_run(tmp_path, "exp", [job])
    (run / "jobs" / "j" / "metrics.csv").write_text("epoch,split,acc\n0,validation,0.9\n1,validation,0.93\n")
    [row] = json.loads(summarize([run], fmt="json"))["rows"]
    assert row["val_acc_so_far"] == pytest.approx(0.93) and row["best_val_acc"] is None
    assert "(93.0 so far)" in summarize([run], width=300)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet="ab*?[]!-.x\n", min_size=1, max_size=8), min_size=1, max_size=3),
    st.text(alphabet="ab*?[]!-.x\n/", max_size=10),
)
def test_a_schedulers_log_patterns_match_the_names_fnmatch_matches(patterns: list[str], name: str) -> None:
    """The one regular expression a log listing compiles for a folder's patterns matches a file name
    exactly when one of the patterns does (fnmatchcase, as the listing matched before)."""
    import fnmatch

    from jobgen.backends._base import _matcher

    assert bool(_matcher(tuple(patterns))(name)) == any(fnmatch.fnmatchcase(name, p) for p in patterns)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.lists(st.sampled_from("ab"), max_size=3))
def test_the_results_tolerant_converters_take_exactly_the_json_values_they_took(value, keys) -> None:
    """The converters' fast paths (exact JSON types first) accept and refuse what the plain isinstance
    checks did: a bool is no number, NaN, the infinities and an integer beyond a float are unknown, an
    empty text is none, a path through a non-object ends."""
    import math
    from collections.abc import Mapping

    from jobgen.results import collect as c

    def get(data, *path):
        for key in path:
            if not isinstance(data, Mapping):
                return None
            data = data.get(key)
        return data

    try:
        num = None if isinstance(value, bool) or not isinstance(value, int | float) else float(value)
    except OverflowError:
        num = None
    assert (c._num(value) is None) == (num is None or not math.isfinite(num))
    if num is not None and math.isfinite(num):
        assert c._num(value) == num and type(c._num(value)) is float
    want_int = value if isinstance(value, int) and not isinstance(value, bool) else None
    assert c._int(value) == want_int and type(c._int(value)) is type(want_int)
    assert c._str(value) == (value if isinstance(value, str) and value else None)
    assert repr(c._get({"a": value, "b": {"a": value}}, *keys)) == repr(get({"a": value, "b": {"a": value}}, *keys))


def test_no_number_beyond_a_floats_range_or_infinite_is_read() -> None:
    from jobgen.results import collect as c

    assert [c._num(v) for v in (10**400, -(10**400), float("inf"), float("-inf"), 2**64, 1.5)] == [
        None,
        None,
        None,
        None,
        float(2**64),
        1.5,
    ]


_FIELD = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["2026-01-02T03:04:05Z", "2026-01-02T03:04:05.5+02:00", "2026-01-02T03:04:05"])
)


def _maybe_object(keys: list[str]):
    return st.dictionaries(st.sampled_from(keys), _FIELD | st.lists(_FIELD, max_size=2), max_size=len(keys)) | _FIELD


_RESULT_DOCS = st.fixed_dictionaries(
    {},
    optional={
        "engine": _FIELD,
        "precision": _maybe_object(["requested", "effective"]),
        "compile": _FIELD,
        "nodes": _FIELD,
        "times_s": _maybe_object(["train", "total"]),
        "throughput": _maybe_object(["samples_per_s", "tokens_per_s"]),
        "peak_memory_mb": _maybe_object(["gpu_max_allocated", "host_rss"]),
        "test_acc": _FIELD,
        "requeue_count": _FIELD,
        "finished_at": _FIELD,
        "samples": _maybe_object(["validation", "test"]),
        "scored": _maybe_object(["validation", "test"]),
        "parameters": _maybe_object(["total"]),
        "ran_on": st.dictionaries(st.just("gpus"), st.lists(_FIELD, max_size=3) | _FIELD),
        "world_size": _FIELD,
    },
)


@settings(max_examples=300, deadline=None)
@given(_RESULT_DOCS)
def test_a_results_numbers_kept_read_back_as_the_result_read_fresh(doc) -> None:
    """What a status or summary keeps of a result.json (result_fields, written to the run's index by
    compact JSON and read back) makes the very Result a fresh read makes: the same numbers, times
    and texts, whatever types the fields hold."""
    import math

    from jobgen.results import collect as c

    fresh = c.parse_result(doc)
    kept = json.loads(json.dumps(c.result_fields(doc), separators=(",", ":")))
    assert c._is_result_fields(kept)
    assert c._result(kept) == fresh  # a naive time is read as local time either way
    for value in c.result_fields(doc).values():
        assert not isinstance(value, float) or math.isfinite(value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=120))
def test_a_logs_tail_is_its_last_bytes_read_whole(content: bytes, tail: int) -> None:
    """logs.tail_lines reads a log's last TAIL_BYTES (fewer when the log is shorter): its lines are
    those of exactly those bytes, whatever they hold (bytes that are not UTF-8, lines cut mid-way)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "slurm-1.out"
        path.write_bytes(content)
        real = logs.TAIL_BYTES
        logs.TAIL_BYTES = tail
        try:
            lines = logs.tail_lines(path)
        finally:
            logs.TAIL_BYTES = real
    text = content[-tail:].decode("utf-8", errors="replace").splitlines()
    assert lines == [logs.strip_label(ln).strip() for ln in text if ln.strip()]
    assert logs.tail_lines(Path("/nonexistent/slurm-1.out")) == []
