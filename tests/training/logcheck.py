"""What a job log must look like (training/console.py, training/progress.py), checked on real runs.

Every line either is one of ours or is not progress at all; no line of the libraries' known noise; no
silence longer than the heartbeat allows, from the process' start to its last line."""

from __future__ import annotations

import re
from collections import Counter

from training import progress

# The noise issue 18 lists, each as it appeared in the demo's log before the output layer.
NOISE = {
    "DeepSpeed's accelerator probe": re.compile(r"Setting accelerator to CPU"),
    "Lightning's litlogger tip": re.compile(r"litlogger|💡 Tip"),
    "Lightning's device lines": re.compile(r"^(GPU|TPU|HPU) available: "),
    "the torch _pytree deprecation": re.compile(r"LeafSpec|_pytree"),
    "transformers' bars": re.compile(r"Writing model shards|Loading weights"),
    "Fabric's seed line": re.compile(r"Seed set to"),
    "a blank line": re.compile(r"^\s*$"),
    # Other engines' progress styles: tqdm, rich (Lightning's bar and test table), the HF Trainer's dicts.
    "a tqdm bar": re.compile(r"\d+%\|| it/s|it/s\]"),
    "a rich bar or table": re.compile(r"[━┏┃┡│└]"),
    "an HF Trainer dict": re.compile(r"^\{'"),
}
# A line that speaks of progress: it must be one of the formats training/progress.py defines.
LOOKS_LIKE_PROGRESS = re.compile(r"(?i)\bepoch\s+\d|\bloss\b|samples/s|\bstep\s+\d")
OURS = (progress.PROGRESS_LINE, progress.EPOCH_LINE, progress.HEARTBEAT_LINE, re.compile(r"^training: samples/s "))


def check_log(lines: list[tuple[float, str]], max_gap_s: float) -> list[str]:
    """The problems of one run's output (`lines` as tests.training.conftest.start records them: the
    first entry is the start); [] for a log as it should be."""
    problems = []
    texts = [text for _, text in lines[1:]]
    for text in texts:
        for name, pattern in NOISE.items():
            if pattern.search(text):
                problems.append(f"{name}: {text!r}")
        if LOOKS_LIKE_PROGRESS.search(text) and not any(p.match(text) for p in OURS):
            problems.append(f"progress not in the one format: {text!r}")
    if not any(progress.parse(text) for text in texts):
        problems.append("no progress line")
    gaps = [(later - earlier, text) for (earlier, _), (later, text) in zip(lines, lines[1:], strict=False)]
    problems += [f"{gap:.1f} s of silence before {text!r}" for gap, text in gaps if gap > max_gap_s]
    return problems


def result_rate(texts: list[str]) -> float | None:
    """samples/s of the result line (`training: samples/s 93.9 (timing window: ...)`)."""
    found = [re.match(r"^training: samples/s (\S+) ", t) for t in texts]
    rates = [float(m.group(1)) for m in found if m]
    return rates[-1] if rates else None


def check_two_rank_log(log: str, epochs: int) -> None:
    """The log of a run on two ranks: each rank says who it is; progress comes from rank 0 alone
    (training/console.py: each epoch's end once, not per rank); every engine's teardown frees its
    process group, so no backend thread lives on into exit (issue 20)."""
    assert "rank 0/2" in log and "rank 1/2" in log, log[-3000:]
    lines = log.splitlines()
    ends = [p.epoch for p in map(progress.parse, lines) if p is not None and p.percent == 100]
    assert ends == list(range(1, epochs + 1)), [ln for ln in lines if progress.is_progress(ln)]
    assert "still running after destroy_process_group" not in log, log[-3000:]
    # No line said again and again (a library's warning at every step) besides the progress lines.
    repeated = {t: n for t, n in Counter(lines).items() if n > 4 and progress.parse(t) is None}
    assert not repeated, repeated
