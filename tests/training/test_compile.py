"""compile=true: torch.compile with warm-up steps timed apart, and padded lengths in buckets."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from tests.training.conftest import REPO, spec_dict
from training.data import prepare
from training.loaders import COMPILE_BUCKET, make_loader
from training.run import run
from training.spec import from_dict

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def inductor_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile's C++ kernels: kept between sessions, one folder per checkout (their build flags
    name the checkout's .venv, so a folder shared by two checkouts is rebuilt whenever the other ran:
    minutes of CPU here), and built in this process (a pool of compile workers imports torch once more
    each). Set for this test alone: exported to the Slurm jobs, which inherit the environment, a cache
    folder that a container does not bind fails torch's import there (it creates the folder)."""
    from torch._inductor import config

    key = zlib.crc32(str(REPO.resolve()).encode())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "jobgen-test" / "inductor" / str(key)))
    monkeypatch.setattr(config, "compile_threads", 1)


@pytest.mark.usefixtures("inductor_cache")
def test_compiled_run_reports_compile_time_apart_and_learns(tmp_path: Path, cache_dir: Path) -> None:
    job = tmp_path / "job"
    train = {"engine": "torch", "compile": True, "warmup_compile_steps": 3, "epochs": 1}
    # max_length 48: batches pad to 32 or 64 (buckets), never to the 20-odd lengths in between.
    spec = from_dict(spec_dict(job, cache_dir, train=train, data={"max_length": 48}))
    prepared = prepare(spec)
    widths = {b["input_ids"].shape[1] for b in make_loader(prepared.splits["train"], spec, prepared.tokenizer, True)}
    assert widths == {32, 64} and all(w % COMPILE_BUCKET == 0 for w in widths)  # two shapes, not ~30

    # The run: max_length 32, one bucket, so inductor compiles one shape (each shape is its C++ build:
    # minutes of CPU on the 2-core test machine when the compile cache is cold).
    spec = from_dict(spec_dict(job, cache_dir, train=train, data={"max_length": 32}))
    assert run(spec) == 0
    result = json.loads((job / "result.json").read_text())
    assert result["compile"] is True
    times = result["times_s"]
    # The first steps carry the compilation: far slower than the steady steps the throughput counts.
    steady_step = times["train"] / (1600 / 32 - 3)
    assert times["warmup_compile"] > 10 * steady_step, times
    assert result["test_acc"] >= 0.90
