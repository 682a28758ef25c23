"""What jobs cost (jobgen.results.cost): sacct's accounting read from stub output, the request when there is
none, MFU against the GPU table, and the rules every size must keep (totals, scaling efficiency)."""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen.backends import _slurm as track
from jobgen.backends._base import Attempt
from jobgen.record import store
from jobgen.record.model import RunJob
from jobgen.results import cost
from jobgen.results.columns import Line, Stat
from jobgen.results.state_rule import read_some
from jobgen.results.summary import apply_baseline, summarize, totals
from tests.core.conftest import stub_tool
from tests.data.summary.synth import FakeJob, write_run
from training import contract


def _sacct(bin_dir: Path, usage_lines: list[str], state_lines: list[str] = ()) -> None:
    """A stub sacct that answers the usage query (USAGE_FIELDS) with `usage_lines` and the status query
    with `state_lines`, and writes down every call."""
    usage = " ".join(f"'{line}'" for line in usage_lines) or "''"
    states = " ".join(f"'{line}'" for line in state_lines) or "''"
    stub_tool(
        bin_dir,
        "sacct",
        f'echo "$*" >> "$(dirname "$0")/sacct.calls"\n'
        f'case "$*" in *--format={track.USAGE_FIELDS}*) printf "%s\\n" {usage};; *) printf "%s\\n" {states};; esac\n',
    )


# --- AllocTRES, ElapsedRaw, TimelimitRaw, ConsumedEnergyRaw -------------------------------------------------


@pytest.mark.parametrize(
    ("tres", "cpus", "gpus"),
    [
        ("billing=8,cpu=8,gres/gpu=4,mem=64G,node=1", 8, 4),
        # Slurm lists the typed count beside the total: the total, not their sum.
        ("billing=16,cpu=16,gres/gpu:a100=4,gres/gpu=4,mem=128G,node=2", 16, 4),
        ("cpu=4,gres/gpu:a100=2,gres/gpu:v100=1,node=1", 4, 3),  # typed counts only: their sum
        # No gres/gpu: a CPU job, or a cluster whose accounting does not track GPUs: unknown here.
        ("billing=2,cpu=2,mem=1000M,node=1", 2, None),
        ("", None, None),  # nothing allocated (never started): unknown
    ],
)
def test_alloc_tres_gives_cpus_and_gpus(tres: str, cpus: int | None, gpus: int | None) -> None:
    jid, attempt = track.parse_usage_line(f"71|2026-01-01T00:00:00|3600|60|{tres}||COMPLETED")
    assert jid == "71" and attempt.cpus == cpus and attempt.gpus == gpus
    assert attempt.elapsed_s == 3600 and attempt.limit_s == 3600  # TimelimitRaw is minutes


@pytest.mark.parametrize(
    ("raw", "joules"),
    [("0", None), ("", None), ("18446744073709551614", None), ("7200000", 7_200_000)],
)
def test_energy_is_unknown_where_the_cluster_records_none(raw: str, joules: int | None) -> None:
    _, attempt = track.parse_usage_line(f"5|2026-01-01T00:00:00|10|UNLIMITED|cpu=1,node=1|{raw}|COMPLETED")
    assert attempt.energy_j == joules
    assert attempt.limit_s is None  # an unlimited job has no share of its limit


@pytest.mark.parametrize(
    "line",
    [
        "11|COMPLETED|0:0|00:01:02|2|n[1-2]|x|2026-01-01T00:00:00|2026-01-01T00:01:02",  # the status query's shape
        "12|Unknown|N/A|60|cpu=1|",  # no ElapsedRaw
        "",
    ],
)
def test_lines_of_another_shape_are_not_read_as_usage(line: str) -> None:
    assert track.parse_usage_line(line) is None


def test_a_requeued_job_is_every_attempt_sacct_d_lists(bin_dir: Path) -> None:
    _sacct(
        bin_dir,
        [
            # Slurm requeued 81 once: the first attempt ran 600 s on 4 GPUs, the second 1800 s.
            "81|2026-01-01T00:00:00|600|60|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|0|REQUEUED",
            "81|2026-01-01T00:20:00|1800|60|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|0|COMPLETED",
            "82|Unknown|0|60||0|PENDING",  # still pending
            "83|2026-01-01T00:30:00|0|Partition_Limit||0|CANCELLED by 0",  # cancelled in the queue: a Start, no allocation
            # 84 ended after 300 s (paused at a halving rung) and was requeued 2 h later (promoted): Slurm
            # records that attempt as held until the requeue; its batch step, as ended after 300 s.
            "84|2026-01-01T00:00:00|7500|60|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|0|REQUEUED",
            "84|2026-01-01T02:05:00|900|60|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|0|COMPLETED",
        ],
        [  # the steps of the jobs with a REQUEUED attempt, every attempt's (sacct -D without -X)
            "81|2026-01-01T00:00:00|600",
            "81.batch|2026-01-01T00:00:00|600",
            "81.0|2026-01-01T00:00:01|599",
            "84|2026-01-01T00:00:00|7500",
            "84.batch|2026-01-01T00:00:00|300",
            "84.0|2026-01-01T00:00:01|298",
            "84.batch|2026-01-01T02:05:00|900",
        ],
    )
    found = track.usage(["81", "82", "83", "81", "84"])
    calls = (bin_dir / "sacct.calls").read_text().splitlines()
    assert len(calls) == 2 and " -D " in f" {calls[0]} " and " -X " in f" {calls[0]} "
    assert calls[0].endswith("-j 81,82,83,84")  # each id once
    assert " -X " not in f" {calls[1]} " and calls[1].endswith("-j 81,84")  # only jobs with a REQUEUED attempt
    assert [a.elapsed_s for a in found["81"]] == [600, 1800]
    assert [a.elapsed_s for a in found["84"]] == [300, 900]  # not 7500: the 2 h paused are not paid for
    usage = cost.from_attempts(found["81"])
    assert usage.gpu_hours == pytest.approx(4 * 2400 / 3600) and usage.cpu_hours == pytest.approx(8 * 2400 / 3600)
    assert usage.time_used == pytest.approx(2400 / 7200)  # every attempt's elapsed over every attempt's limit
    assert usage.energy_kwh is None  # 0: no energy plugin, not "no energy"
    for never in ("82", "83"):  # never started: nothing to count, and nothing unknown
        assert not cost.from_attempts(found[never]).ran and cost.from_attempts(found[never]).gpu_hours is None


def test_tasks_with_the_same_usage_each_keep_their_own(bin_dir: Path) -> None:
    """A sweep's tasks mostly print the same fields after their id: every id gets its own attempts (a
    requeued one two, in order), and a line of another shape is none."""
    same = "|2026-01-01T00:00:00|600|60|billing=4,cpu=4,gres/gpu=1,node=1|0|COMPLETED"
    _sacct(
        bin_dir,
        [f"9_{i}{same}" for i in range(300)]
        + ["9_300|2026-01-01T00:00:00|60|60|billing=4,cpu=4,gres/gpu=1,node=1|0|REQUEUED", f"9_300{same}"]
        + ["9_301|not|a|usage|line", f"9_301{same}"],
    )
    found = track.usage([f"9_{i}" for i in range(302)])
    assert [a.elapsed_s for a in found["9_300"]] == [60, 600] and not found["9_300"][0].final
    assert all(found[f"9_{i}"] == [track.Attempt(True, 600, 3600, 4, 1, None, True)] for i in (0, 299, 301))


def test_energy_of_every_attempt_or_none() -> None:
    one = Attempt(True, 100, 600, 4, 1, 3_600_000)
    assert cost.from_attempts([one, one]).energy_kwh == pytest.approx(2.0)
    assert cost.from_attempts([one, Attempt(True, 100, 600, 4, 1, None)]).energy_kwh is None


_COUNT = st.none() | st.integers(0, 64)
_ATTEMPTS = st.lists(
    st.builds(Attempt, st.booleans(), st.integers(0, 10**6), _COUNT, _COUNT, _COUNT, st.none() | st.integers(0, 10**9)),
    max_size=6,
)


@given(_ATTEMPTS, _COUNT)
def test_gpu_hours_take_the_requests_gpus_where_the_accounting_lists_none(attempts, asked) -> None:
    """Each attempt that started counts its own GPUs, or the request's where the accounting tracks none;
    a count that stays unknown leaves the sum unknown (never a sum with an attempt left out)."""
    before = [repr(a) for a in attempts]
    usage = cost.from_attempts(attempts, asked)
    assert [repr(a) for a in attempts] == before  # the attempts themselves unchanged
    ran = [a for a in attempts if a.started]
    gpus = [a.gpus if a.gpus is not None else asked for a in ran]
    if not ran:
        assert not usage.ran and usage.gpu_hours is None and usage.cpu_hours is None
        return
    want_gpu = None if None in gpus else math.fsum(g * a.elapsed_s for g, a in zip(gpus, ran, strict=True)) / 3600
    want_cpu = None if any(a.cpus is None for a in ran) else math.fsum(a.cpus * a.elapsed_s for a in ran) / 3600
    assert (usage.gpu_hours, usage.cpu_hours) == (want_gpu, want_cpu)


@given(
    st.builds(Attempt, st.just(True), st.integers(0, 10**6), _COUNT, _COUNT, _COUNT, st.none() | st.integers(0, 10**9)),
    _COUNT,
)
def test_one_attempt_sums_as_any_other_number_of_them(attempt, asked) -> None:
    """A job that ran once (most) is summed by a shorter way: every number is the one the sums over
    several attempts give when the others never started."""
    never = Attempt(False, 0, None, None, None, None)
    assert cost.from_attempts([attempt], asked) == cost.from_attempts([attempt, never], asked)


@given(st.lists(st.sampled_from([True, False, 0, 7, None, 1.5, "7"]), min_size=6, max_size=8))
def test_a_kept_attempt_is_taken_only_with_the_types_of_its_fields(values: list) -> None:
    """Kept attempts are told from damaged ones by the type of each value: bool, int, four ints or
    None, bool; a yes/no is no number here and a number no yes/no."""
    kinds = (bool, int, int, int, int, int, bool)
    valid = len(values) == 7 and all(
        type(v) is kind or (v is None and 2 <= n <= 5) for n, (v, kind) in enumerate(zip(values, kinds, strict=False))
    )
    assert cost._is_attempt(values) == valid and not cost._is_attempt(tuple(values))


@given(st.lists(st.sampled_from([None, 0, 5, True, 1.5, "3"]), max_size=4))
def test_a_kept_request_is_taken_only_as_three_whole_numbers_or_none(values: list) -> None:
    """What a spec.json asked for, kept in the run's index: GPUs, CPUs and seconds, each an int or
    None (a yes/no is no count); anything else is a damaged cache, read again."""
    assert cost._is_asked(values) == (len(values) == 3 and all(v is None or type(v) is int for v in values))
    assert not cost._is_asked(tuple(values))


def test_without_accounting_usage_is_empty(bin_dir: Path) -> None:
    stub_tool(bin_dir, "sacct", "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1\n")
    assert track.usage(["1", "2"]) == {}


def test_usage_is_one_sacct_per_chunk_of_ids(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _sacct(bin_dir, [])
    monkeypatch.setattr(track, "SACCT_ARG_BYTES", 5)  # "0,1,2" fits, "0,1,2,3" does not
    track.usage([str(i) for i in range(7)])
    assert [c.split()[-1] for c in (bin_dir / "sacct.calls").read_text().splitlines()] == ["0,1,2", "3,4,5", "6"]


@given(st.lists(st.text("0123456789_", min_size=1, max_size=14), max_size=300), st.integers(14, 200))
def test_sacct_chunks_keep_every_id_in_order_within_the_argument_limit(ids: list[str], limit: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(track, "SACCT_ARG_BYTES", limit)
        chunks = track.sacct_chunks(ids)
    assert [i for chunk in chunks for i in chunk] == ids and all(chunks)
    assert all(len(",".join(chunk)) <= limit for chunk in chunks)
    # as few as fit: no chunk could have taken the next one's first id
    assert all(len(",".join([*a, b[0]])) > limit for a, b in zip(chunks, chunks[1:], strict=False))


def test_ten_thousand_job_ids_are_one_sacct() -> None:
    ids = [str(12_345_678 + i) for i in range(10_000)]  # 8-digit ids, as a busy cluster has
    assert len(track.sacct_chunks(ids)) == 1 and len(",".join(ids)) < 128 * 1024


# --- summary: sacct where the cluster keeps accounting, else the request ------------------------------------

REQUEST = {
    "nodes": 2,
    "gpus_per_node": 4,
    "ntasks_per_node": 4,
    "cpus_per_task": 3,
    "time": "02:00:00",
    "exclusive": False,
    "extra": {},
}


def _json(runs: list) -> dict:
    return json.loads(summarize(runs, fmt="json", combine=False))


def test_summary_takes_the_hours_from_sacct(tmp_path: Path, bin_dir: Path) -> None:
    run = write_run(
        tmp_path,
        "exp",
        [
            FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800),
            FakeJob("b", state="COMPLETED", slurm=REQUEST, job_ids=["90", "91"]),  # jobgen submitted it again
        ],
    )
    _sacct(
        bin_dir,
        [
            # sacct knows better than the request: 24 CPUs asked, 32 held (whole cores).
            "4000|2026-01-01T00:00:00|1800|120|billing=32,cpu=32,gres/gpu=8,mem=64G,node=2|5400000|COMPLETED",
            "90|2026-01-01T00:00:00|7200|120|cpu=32,gres/gpu:h100=8,gres/gpu=8,node=2||COMPLETED",
            "91|2026-01-01T02:00:00|3600|120|cpu=32,gres/gpu:h100=8,gres/gpu=8,node=2||COMPLETED",
        ],
    )
    doc = _json(read_some([run]))
    a, b = doc["rows"]
    assert a["gpu_hours"] == pytest.approx(8 * 0.5) and a["cpu_hours"] == pytest.approx(32 * 0.5)
    assert a["energy_kwh"] == pytest.approx(1.5) and a["time_used_fraction"] == pytest.approx(0.25)
    assert b["gpu_hours"] == pytest.approx(8 * 3) and b["energy_kwh"] is None
    assert a["usage_from"] == b["usage_from"] == "sacct"
    assert b["time_used_fraction"] == pytest.approx(3 / 4)  # 3 h used of 2 × 2 h asked
    assert doc["totals"] == {"jobs": 2, "gpu_hours": pytest.approx(28.0), "cpu_hours": pytest.approx(112.0)} | {
        "energy_kwh": None  # one job's energy is unknown: so is the sweep's
    }
    calls = (bin_dir / "sacct.calls").read_text().splitlines()
    assert sum(track.USAGE_FIELDS in c for c in calls) == 1  # one question for the whole sweep


def test_a_chain_is_every_segment_that_ran(tmp_path: Path, bin_dir: Path) -> None:
    run = write_run(
        tmp_path, "exp", [FakeJob("chained", state="COMPLETED", slurm=REQUEST, segments=["70", "71", "72"])]
    )
    _sacct(
        bin_dir,
        [
            "70|2026-01-01T00:00:00|7200|120|cpu=24,gres/gpu=8,node=2||TIMEOUT",  # ran to its limit
            "71|2026-01-01T02:00:00|1800|120|cpu=24,gres/gpu=8,node=2||COMPLETED",  # finished the training
            "72|2026-01-01T02:30:00|0|120|||CANCELLED by 0",  # cancelled in the queue once the training was done
        ],
    )
    (row,) = _json(read_some([run]))["rows"]
    assert row["gpu_hours"] == pytest.approx(8 * 2.5) and row["cpu_hours"] == pytest.approx(24 * 2.5)
    assert row["time_used_fraction"] == pytest.approx(2.5 / 4)  # of the two segments that ran


def test_gpus_the_accounting_does_not_track_come_from_the_request(tmp_path: Path, bin_dir: Path) -> None:
    """AccountingStorageTRES without gres/gpu: AllocTRES lists no GPUs for any job, GPU jobs too."""
    jobs = [
        FakeJob("gpu", state="COMPLETED", slurm=REQUEST),
        FakeJob("cpu", state="COMPLETED", slurm={**REQUEST, "gpus_per_node": 0}),
        FakeJob("whole-nodes", state="COMPLETED", slurm={**REQUEST, "exclusive": True}),
    ]
    run = write_run(tmp_path, "exp", jobs)
    _sacct(
        bin_dir,
        [f"{4000 + i}|2026-01-01T00:00:00|3600|120|billing=32,cpu=32,mem=64G,node=2||COMPLETED" for i in range(3)],
    )
    rows = {r["config"]: r for r in _json(read_some([run]))["rows"]}
    assert rows["gpu"]["gpu_hours"] == pytest.approx(2 * 4) and rows["gpu"]["cpu_hours"] == pytest.approx(32)
    assert rows["cpu"]["gpu_hours"] == 0
    assert rows["whole-nodes"]["gpu_hours"] is None and rows["whole-nodes"]["cpu_hours"] == pytest.approx(32)


def test_without_accounting_the_hours_come_from_the_request(tmp_path: Path, bin_dir: Path) -> None:
    stub_tool(bin_dir, "sacct", "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1\n")
    jobs = [
        FakeJob("gpu", state="COMPLETED", slurm=REQUEST, ran_s=1800),
        FakeJob("cpu", state="COMPLETED", slurm={**REQUEST, "gpus_per_node": 0, "time": "45"}, ran_s=86400),
        FakeJob("exclusive", state="COMPLETED", slurm={**REQUEST, "exclusive": True}, ran_s=1800),
        FakeJob("extra-gres", state="COMPLETED", slurm={**REQUEST, "extra": {"gres": "gpu:2"}}, ran_s=1800),
        FakeJob("requeued", state="COMPLETED", slurm=REQUEST, ran_s=1800, requeue_count=1),
        FakeJob("jobgen-requeued", state="COMPLETED", slurm=REQUEST, ran_s=1800, requeues=1),
        FakeJob("resubmitted", state="COMPLETED", slurm=REQUEST, ran_s=1800, job_ids=["1", "2"]),
        FakeJob("no-elapsed", state="COMPLETED", slurm=REQUEST),
        # Last seen running (an elapsed time, no end): it ran longer than that, for how long is unknown.
        FakeJob("stale", state="COMPLETED", slurm=REQUEST, elapsed="00:10:00"),
        FakeJob("unlimited", state="COMPLETED", slurm={**REQUEST, "time": "UNLIMITED"}, ran_s=1800),
    ]
    rows = {r["config"]: r for r in _json(read_some([write_run(tmp_path, "exp", jobs)]))["rows"]}
    gpu = rows["gpu"]
    assert gpu["gpu_hours"] == pytest.approx(2 * 4 * 0.5) and gpu["cpu_hours"] == pytest.approx(2 * 4 * 3 * 0.5)
    assert gpu["time_used_fraction"] == pytest.approx(0.25) and gpu["energy_kwh"] is None
    assert gpu["usage_from"] == "request" and rows["no-elapsed"]["usage_from"] is None
    assert rows["cpu"]["gpu_hours"] == 0 and rows["cpu"]["cpu_hours"] == pytest.approx(24 * 24)
    assert rows["cpu"]["time_used_fraction"] == pytest.approx(24 * 60 / 45)  # "45" is minutes, as sbatch reads it
    # Where the request does not say what the job held, or earlier attempts are recorded nowhere: blank.
    assert rows["exclusive"]["cpu_hours"] is None and rows["exclusive"]["gpu_hours"] is None
    assert rows["extra-gres"]["gpu_hours"] is None
    for name in ("requeued", "jobgen-requeued", "resubmitted", "no-elapsed", "stale"):
        assert rows[name]["gpu_hours"] is None and rows[name]["time_used_fraction"] is None, name
    assert rows["unlimited"]["gpu_hours"] == pytest.approx(4.0) and rows["unlimited"]["time_used_fraction"] is None


def test_a_copied_run_is_summarized_from_what_its_manifest_recorded(tmp_path: Path, monkeypatch) -> None:
    """No Slurm at all (a run copied to a laptop): the request × the start and end jobgen recorded."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=3600)])
    (row,) = _json(read_some([run]))["rows"]
    assert row["gpu_hours"] == pytest.approx(8.0) and row["cpu_hours"] == pytest.approx(24.0)


def test_blank_cells_are_blank_in_every_format(tmp_path: Path) -> None:
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    csv_text = summarize([run], fmt="csv")
    header, row = csv.reader(csv_text.splitlines())
    values = dict(zip(header, row, strict=True))
    assert values["energy_kwh"] == "" and values["gpu_hours"] == "4.0"
    table = summarize([run], width=400)
    assert "total of 1 job: 4.00 GPU-h, 12.0 CPU-h, energy unknown" in table
    assert "total of 1 job: 4.00 GPU-h" in summarize([run], fmt="markdown")


# --- MFU ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.4),
        ("NVIDIA H100 PCIe", "16-mixed", 756.5),
        ("NVIDIA H200", "bf16-true", 989.4),
        ("NVIDIA H200", "32-true", 67.0),
        ("NVIDIA A100-SXM4-80GB", "bf16-mixed", 312.0),
        ("NVIDIA A100-PCIE-40GB", "32-true", 19.5),
        ("Tesla V100-SXM2-32GB", "16-mixed", 125.0),
        ("NVIDIA L40S", "bf16-mixed", 362.05),
        ("NVIDIA L4", "bf16-mixed", 121.0),
        ("NVIDIA A10", "bf16-mixed", 125.0),
        ("Tesla T4", "16-mixed", 65.0),
        ("Tesla T4", "bf16-mixed", None),  # no bf16 tensor cores: no peak to compare with
        ("NVIDIA A10G", "bf16-mixed", 70.0),  # not the A10's 125: its own name, its own peak
        ("NVIDIA A10G", "32-true", 35.0),
        ("NVIDIA GeForce RTX 4090", "bf16-mixed", 165.2),
        ("NVIDIA GeForce RTX 4090", "32-true", 82.6),
        ("Tesla V100S-PCIE-32GB", "16-mixed", 130.0),  # not the V100-PCIE's 112
        ("Tesla V100S-PCIE-32GB", "bf16-mixed", None),
        ("NVIDIA H100 NVL", "bf16-mixed", 835.5),  # not the SXM's 989.4
        ("NVIDIA H100 NVL", "32-true", 60.0),
        ("NVIDIA H200 NVL", "bf16-mixed", 835.5),
        ("NVIDIA GH200 480GB", "bf16-mixed", 989.4),
        ("NVIDIA GH200 144G HBM3e", "32-true", 67.0),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16-mixed", None),  # a slice: not the parent's peak
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "32-true", None),
        ("NVIDIA H200", "64-true", None),
        ("NVIDIA H200", "16-true", None),  # not a precision of the contract
        ("Some Future GPU", "bf16-mixed", None),  # not in the table: blank, not a neighbour's peak
    ],
)
def test_peak_by_gpu_name_and_precision(name: str, precision: str, tflops: float | None) -> None:
    peak = cost.peak_flops(name, precision)
    assert peak == (None if tflops is None else pytest.approx(tflops * 1e12))


def test_every_precision_of_the_contract_names_the_dtype_it_computes_in() -> None:
    """One list of precisions (training/contract.py) says each one's compute dtype; MFU reads no other."""
    assert set(contract.COMPUTE_DTYPES) == set(contract.PRECISIONS)
    assert set(contract.COMPUTE_DTYPES.values()) <= {"fp32", "fp16", "bf16"}
    for precision in contract.PRECISIONS:  # a 32-true job is held to the FP32 peak, 15x below the bf16 one
        expected = {"fp32": 67.0, "fp16": 989.4, "bf16": 989.4}[contract.COMPUTE_DTYPES[precision]]
        assert cost.peak_flops("NVIDIA H100 80GB HBM3", precision) == pytest.approx(expected * 1e12)
    assert not hasattr(cost, "PRECISIONS")


def test_mfu_is_model_flops_over_the_devices_peak(tmp_path: Path) -> None:
    jobs = [
        FakeJob("gpu", state="COMPLETED", nodes=2, devices=4, gpus=["NVIDIA A100-SXM4-80GB"], parameters=10**8),
        FakeJob("cpu", state="COMPLETED", peak_gpu_mb=None, gpus=[], parameters=10**8),
        FakeJob("unknown", state="COMPLETED", gpus=["Some Future GPU"], parameters=10**8),
        FakeJob("mixed", state="COMPLETED", gpus=["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"], parameters=10**8),
    ]
    rows = {r["config"]: r for r in _json([write_run(tmp_path, "exp", jobs)])["rows"]}
    tokens_per_s = jobs[0].samples_per_s * 100  # what synth writes
    assert rows["gpu"]["mfu"] == pytest.approx(6 * 10**8 * tokens_per_s / (8 * 312e12), abs=1e-6)  # JSON: 6 places
    assert rows["cpu"]["mfu"] is None and rows["unknown"]["mfu"] is None and rows["mixed"]["mfu"] is None


# --- rules for all sizes ------------------------------------------------------------------------------------

_amounts = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False))


KINDS = ("ran", "never-started", "cancelled-in-queue")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_amounts, _amounts, _amounts, st.sampled_from(KINDS)), min_size=1, max_size=30))
def test_totals_are_the_sum_over_jobs_or_unknown(jobs: list) -> None:
    """Totals sum every job that ran; one that ran without a value makes the total unknown; a job that
    never ran adds nothing (a job cancelled in the queue has a start time, but sacct says no attempt ran)."""
    from jobgen.results.collect import JobRow
    from jobgen.states import State
    from tests.data.summary.synth import T0

    rows = [
        JobRow(
            run_dir=Path("r"),
            run_id="r",
            experiment="e",
            name=f"j{i}",
            sweep={},
            state=State.COMPLETED,
            started_at=None if kind == "never-started" else T0,
            usage=_usage(gpu, cpu, energy, kind),
        )
        for i, (gpu, cpu, energy, kind) in enumerate(jobs)
    ]
    # Lines of one to three jobs each, as seeds combine: totals sum jobs, not the lines' means.
    lines, i = [], 0
    while i < len(rows):
        size = 1 + i % 3
        lines.append(_line(rows[i : i + size]))
        i += size
    found = totals(lines)
    assert found["jobs"] == len(rows)
    for k, name in enumerate(("gpu_hours", "cpu_hours", "energy_kwh")):
        values = [job[k] for job in jobs if job[3] == "ran"]
        if None in values:
            assert found[name] is None
        else:
            assert found[name] == pytest.approx(math.fsum(values), abs=1e-6)


def _usage(gpu: float | None, cpu: float | None, energy: float | None, kind: str) -> cost.Usage | None:
    if kind == "cancelled-in-queue":
        return cost.Usage(None, None, None, None, "sacct", ran=False)
    if kind == "never-started" or (gpu, cpu, energy) == (None, None, None):
        return None  # nothing known
    return cost.Usage(gpu, cpu, energy, None, "sacct")


def _line(jobs: list) -> Line:
    config = {"nodes": 1, "devices_per_node": 1, "engine": "torch"}
    return Line("x", "e", "r", config, "COMPLETED", len(jobs), {}, "gpu", jobs=jobs)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 64), st.integers(1, 8), st.floats(0.01, 1e6, allow_nan=False)), min_size=1, max_size=12
    ),
    st.data(),
)
def test_scaling_efficiency_of_the_baseline_is_one(shapes: list, data) -> None:
    lines = []
    for n, (nodes, per_node, rate) in enumerate(shapes):
        config = {"nodes": nodes, "devices_per_node": per_node, "engine": "torch"}
        lines.append(Line(f"c{n}", "e", "r", config, "COMPLETED", 1, {"samples_per_s": Stat(rate, None, 1)}, "gpu"))
    base = data.draw(st.sampled_from(lines))
    apply_baseline(lines, base.label)
    assert base.scaling_efficiency == 1.0
    base_devices = base.config["nodes"] * base.config["devices_per_node"]
    for line in lines:
        ratio = line.config["nodes"] * line.config["devices_per_node"] / base_devices
        assert line.scaling_efficiency * ratio == pytest.approx(line.speedup)


# --- the accounting's final word, kept in the manifest -------------------------------------------------------

GPU_ATTEMPT = "|2026-01-01T00:00:00|1800|120|cpu=32,gres/gpu=8,node=2||"


def _usage_calls(bin_dir: Path) -> int:
    calls = bin_dir / "sacct.calls"
    return sum(track.USAGE_FIELDS in c for c in calls.read_text().splitlines()) if calls.exists() else 0


def test_final_usage_is_kept_and_sacct_is_not_asked_again(tmp_path: Path, bin_dir: Path) -> None:
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}COMPLETED"])
    first = _json(read_some([run]))["rows"]
    assert _usage_calls(bin_dir) == 1 and first[0]["gpu_hours"] == pytest.approx(4.0)
    _sacct(bin_dir, [])  # the accounting has forgotten the job (or is down): the kept numbers still hold
    assert _json(read_some([run]))["rows"] == first
    assert _usage_calls(bin_dir) == 1  # not asked again
    assert first[0]["usage_from"] == "sacct"
    # --refresh asks again, and the accounting that forgot the job leaves only the request to go by
    assert _json(read_some([run], refresh=True))["rows"][0]["usage_from"] == "request"
    assert _usage_calls(bin_dir) == 2


def test_kept_usage_is_the_manifests_not_the_index_so_a_deleted_index_asks_sacct_nothing(
    tmp_path: Path, bin_dir: Path
) -> None:
    """What the accounting said of an ended job is kept in the manifest (the accounting purges old jobs,
    so it cannot always be asked again), not in the run's index: deleting the index costs the records'
    reading again, never a question to sacct, and the numbers stay."""
    from jobgen.record.store import load_manifest
    from jobgen.results.cost import USAGE
    from jobgen.results.summary import summary_text

    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    for path in sorted(run.rglob("*"), reverse=True):  # settled: the index keeps what is read of them
        os.utime(path, (time.time() - 60, time.time() - 60))
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}COMPLETED"])
    first = json.loads(summary_text([run], fmt="json")[0])["rows"]
    assert _usage_calls(bin_dir) == 1 and first[0]["gpu_hours"] == pytest.approx(4.0)
    assert USAGE in load_manifest(run)["jobs"][0] and (run / "index.sqlite").is_file()
    _sacct(bin_dir, [])  # the accounting has forgotten the job
    (run / "index.sqlite").unlink()
    assert json.loads(summary_text([run], fmt="json")[0])["rows"] == first
    assert _usage_calls(bin_dir) == 1 and (run / "index.sqlite").is_file()


@pytest.mark.parametrize("state", ["RUNNING", "REQUEUED"])
def test_usage_is_not_kept_before_the_accounting_calls_it_final(tmp_path: Path, bin_dir: Path, state: str) -> None:
    """The accounting lags the controller: a job that ended can still be running there (or only its first,
    requeued attempt be written). Its numbers are used, not kept."""
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}{state}"])
    _json(read_some([run]))
    _json(read_some([run]))
    assert _usage_calls(bin_dir) == 2


def test_a_job_running_is_asked_until_it_ends(tmp_path: Path, bin_dir: Path) -> None:
    run = write_run(tmp_path, "exp", [FakeJob("a", state="RUNNING", slurm=REQUEST, result=None)])
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}COMPLETED"], ["4000|RUNNING|0:0|00:30:00|2|n[1-2]|x|2026-01-01T00:00:00|"])
    _json(read_some([run]))
    _json(read_some([run]))
    assert _usage_calls(bin_dir) == 2


@pytest.mark.parametrize("again", ["jobgen requeue", "slurm restart", "new end"])
def test_a_later_attempt_is_counted_not_the_kept_one(tmp_path: Path, bin_dir: Path, again: str) -> None:
    """Requeued after its usage was kept (same id): every attempt is counted, the new one too."""
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}COMPLETED"])
    assert _json(read_some([run]))["rows"][0]["gpu_hours"] == pytest.approx(4.0)
    if again == "slurm restart":  # the new attempt's result counts one restart
        result = json.loads((run / "jobs/a/result.json").read_text())
        (run / "jobs/a/result.json").write_text(json.dumps({**result, "requeue_count": 1}))
    else:
        fields = {"requeues": 1} if again == "jobgen requeue" else {"ended_at": "2026-01-01T03:00:00"}
        store.update_jobs(run, {"a": fields})
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}REQUEUED", f"4000{GPU_ATTEMPT}COMPLETED"])
    assert _json(read_some([run]))["rows"][0]["gpu_hours"] == pytest.approx(8.0)
    assert _usage_calls(bin_dir) == 2  # asked again: the kept attempt is not the job's last
    _sacct(bin_dir, [])
    assert _json(read_some([run]))["rows"][0]["gpu_hours"] == pytest.approx(8.0)  # both attempts, kept
    assert _usage_calls(bin_dir) == 2


@pytest.mark.parametrize(
    "kept",
    [
        "junk",
        {"key": "junk"},
        {"key": None, "attempts": {"4000": [[True, "1800", 7200, 32, 8, None, True]]}},
        {"key": None, "attempts": {"4000": [[True, 1800, 7200, 32, 8, None]]}},
        {"key": None, "attempts": {"4000": [[1, 1800, 7200, 32, 8, None, True]]}},  # a number for a yes/no
        {"key": None, "attempts": {"4000": [[True, True, 7200, 32, 8, None, True]]}},  # a yes/no for a number
        {"key": None, "attempts": {"4000": [[True, None, 7200, 32, 8, None, True]]}},  # elapsed is never unknown
        {"key": None, "attempts": {"4000": [[True, 1800, 7200.0, 32, 8, None, True]]}},
        {"key": None, "attempts": {"4000": [[True, 1800, 7200, 32, 8, None, None]]}},
        {"key": None, "attempts": {"4000": []}},
        {"key": None, "attempts": []},
    ],
)
def test_a_damaged_kept_usage_is_asked_again(tmp_path: Path, bin_dir: Path, kept: object) -> None:
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    (loaded,) = read_some([run])
    if isinstance(kept, dict) and kept.get("key", "") is None:
        kept = {**kept, "key": cost.usage_key(loaded.jobs[0], 0)}  # the right key, damaged attempts
    store.update_jobs(run, {"a": {cost.USAGE: kept}})
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}COMPLETED"])
    assert _json(read_some([run]))["rows"][0]["gpu_hours"] == pytest.approx(4.0)
    assert _usage_calls(bin_dir) == 1


def test_a_job_queued_again_is_asked_while_it_waits(tmp_path: Path, bin_dir: Path) -> None:
    """Requeued by hand (`scontrol requeue`), seen queued by `status --refresh`: its kept usage is not taken."""
    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", slurm=REQUEST, ran_s=1800)])
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}COMPLETED"])
    _json(read_some([run]))
    store.update_jobs(run, {"a": {"state": "REQUEUED"}})
    waiting = "4000|PENDING|0:0|00:00:00|1|None assigned|x|Unknown|Unknown"
    _sacct(bin_dir, [f"4000{GPU_ATTEMPT}REQUEUED", "4000|Unknown|0|120||0|PENDING"], [waiting])
    (row,) = _json(read_some([run]))["rows"]
    assert row["state"] == "PENDING" and _usage_calls(bin_dir) == 2


def test_what_a_settled_spec_asked_is_not_read_again(tmp_path: Path, bin_dir: Path, monkeypatch) -> None:
    """The accounting lists no GPUs (a cluster that does not track them): each job's request says how many
    it held, read once from spec.json and kept by its stamp."""
    run = write_run(tmp_path, "exp", [FakeJob(f"j{i}", state="COMPLETED", slurm=REQUEST, ran_s=3600) for i in range(2)])
    past = time.time() - 60
    for path in (run / "jobs").rglob("*"):
        os.utime(path, (past, past))
    _sacct(bin_dir, [f"{4000 + i}|2026-01-01T00:00:00|3600|120|cpu=32,node=2||COMPLETED" for i in range(2)])
    loaded = read_some([run])
    first = _json(loaded)["rows"]
    assert [r["gpu_hours"] for r in first] == [pytest.approx(8.0)] * 2
    loaded[0].problems()  # as the command ends: the damage checks, then what was read is kept
    real = RunJob.raw

    def refuse(job: RunJob, name: str) -> bytes | None:
        assert name != "spec.json", "a settled spec.json was read again"
        return real(job, name)

    monkeypatch.setattr(RunJob, "raw", refuse)
    assert _json(read_some([run]))["rows"] == first
