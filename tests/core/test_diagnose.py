"""Why a job stopped (jobgen.results.diagnose): what each log says is reduced to a small JSON value
(log_says, kept by the log's stamp), and the cause is weighed from those values; for any logs it is the
cause the rules give when they read the logs' tails directly."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen.results import diagnose
from jobgen.results.diagnose import RULES, Cause, find_cause, is_log_says, log_says
from jobgen.results.logs import tail_lines
from training.progress import is_progress

LINES = [
    "epoch 1",
    "[jobgen] epoch 1/3 45% (120/266 batches), 12.0 samples/s",
    "[jobgen] training, 30 s so far",
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in <module>',
    "ValueError: bad value",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: rank 1",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***",
    "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***",
    "slurmstepd: error: Detected 1 oom_kill event in StepId=7.0",
    "RuntimeError: [c10d] The client socket has timed out",
    "OSError: [Errno 98] Address already in use",
    "0: rank 0 says hello",
    "[rank1]: KeyError: 'x'",
    "x" * 300,
    "",
]


def _old_find_cause(paths: list[Path], base: Path) -> Cause | None:
    """find_cause as it read the logs before log_says: every rule against every log's tail lines."""
    logs = [(p, tail_lines(p)) for p in paths]
    for rule in RULES:
        for path, lines in logs:
            line = next((ln for ln in reversed(lines) if rule.pattern.search(ln)), None)
            if line is not None:
                return Cause(rule.kind, diagnose._clip(line), rule.hint, diagnose._rel(path, base))
    for path, lines in reversed(logs):
        line = diagnose.last_exception_line(lines)
        if line is not None:
            log = diagnose._rel(path, base)
            return Cause("exception", diagnose._clip(line), diagnose.EXCEPTION_HINT.format(log=log), log)
    for path, lines in reversed(logs):
        if lines:
            log = diagnose._rel(path, base)
            said = next((ln for ln in reversed(lines) if not is_progress(ln)), lines[-1])
            return Cause(diagnose.LAST_LINE, diagnose._clip(said), f"no known cause: read {log}", log)
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(LINES), max_size=8), min_size=0, max_size=3))
def test_the_cause_from_what_each_log_says_is_the_cause_from_the_logs(tmp_path: Path, logs: list[list[str]]) -> None:
    paths = []
    for n, lines in enumerate(logs):
        path = tmp_path / f"slurm-{n}.out"
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
        paths.append(path)
    assert find_cause(paths, tmp_path) == _old_find_cause(paths, tmp_path)
    for path in paths:
        said = log_says(tail_lines(path))
        assert is_log_says(said)


def test_a_kept_value_of_another_shape_is_refused() -> None:
    assert is_log_says([{}, None, None]) and is_log_says([{"time_limit": "x"}, "ValueError: y", "z"])
    for broken in (None, [], [{}, None], [{"k": 1}, None, None], [[], None, None], [{}, 3, None], "x"):
        assert not is_log_says(broken), broken
