"""[sweep.random]: n points sampled from a distribution per dotted key, the same on every machine.

    [sweep.random]
    n = 8                                           # sampled points (1 to MAX_N)
    seed = 0                                        # default 0
    "train.lr" = { loguniform = [1e-5, 1e-3] }      # low > 0; uniform in log space
    "train.warmup_ratio" = { uniform = [0.0, 0.2] }
    "train.epochs" = { int = [1, 3] }               # integers, both ends included
    "train.batch_size" = { choice = [16, 32] }      # one of the values, each equally likely

Sampling is `random.Random(seed)` (Python's Mersenne Twister, no numpy): point 0 first, and within a
point the keys in sorted order, one draw each (`uniform`: rng.uniform; `loguniform`:
exp(rng.uniform(log low, log high)); `int`: rng.randint; `choice`: rng.choice). Floats are then rounded
to DIGITS significant digits (and kept within [low, high]), so the float that lands in the spec is the
same everywhere, whatever the platform's exp and log round. Point i does not depend on n: raising n
adds points after the ones there were.
"""

from __future__ import annotations

import math
import random
from typing import Any

from training.contract import show, suggest

DISTRIBUTIONS = ("uniform", "loguniform", "choice", "int")
SETTINGS = ("n", "seed")
MAX_N = 100_000
MAX_SEED = 2**63 - 1
DIGITS = 6


def dist_keys(table: dict[str, Any]) -> list[str]:
    """The dotted keys a [sweep.random] table samples, sorted (the sampling order)."""
    return sorted(k for k in table if k not in SETTINGS)


def problems(table: dict[str, Any]) -> list[tuple[str, str]]:
    """(the key's name in [sweep.random], problem) for each thing wrong with the table, settings first;
    the name is 'n', 'seed' or a dotted key. Whether a dotted key is sweepable is the caller's check."""
    if not table:
        return []
    out: list[tuple[str, str]] = []
    n: Any = table.get("n")
    if "n" not in table:
        out.append(("n", f"missing: say how many points to sample, e.g. n = 8 (at most {MAX_N})"))
    elif not _is_int(n) or not 1 <= n <= MAX_N:
        out.append(("n", f"must be an integer from 1 to {MAX_N}, got {show(n)}"))
    seed: Any = table.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        out.append(("seed", f"must be an integer from 0 to 2**63 - 1, got {show(seed)}"))
    keys = dist_keys(table)
    if not keys:
        out.append(("n", 'nothing to sample: add a key, e.g. "train.lr" = { loguniform = [1e-5, 1e-3] }'))
    for key in keys:
        problem = dist_problem(table[key])
        if problem:
            out.append((key, problem))
    return out


def dist_problem(spec: Any) -> str | None:
    """What is wrong with one key's distribution, e.g. { uniform = [0.0, 0.2] }; None when nothing is."""
    example = (
        "give one of { uniform = [low, high] }, { loguniform = [low, high] }, { int = [low, high] }, { choice = [...] }"
    )
    if not isinstance(spec, dict) or not spec:
        return f"expected a distribution table, got {show(spec)}; {example}"
    if len(spec) > 1:
        return f"{len(spec)} distributions ({', '.join(sorted(spec))}); give one"
    ((kind, args),) = spec.items()
    if kind not in DISTRIBUTIONS:
        return f"unknown distribution {show(kind)}{suggest(kind, DISTRIBUTIONS)}; use one of {', '.join(DISTRIBUTIONS)}"
    if kind == "choice":
        if not isinstance(args, list):
            return f"choice takes a list of values, got {show(args)}"
        return "choice has no values; give at least one" if not args else None
    if not isinstance(args, list) or len(args) != 2:
        return f"{kind} takes [low, high], got {show(args)}"
    low, high = args
    if kind == "int":
        if not (_is_int(low) and _is_int(high)):
            return f"int bounds must be integers, got {show(args)}"
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in args):
        return f"{kind} bounds must be finite numbers, got {show(args)}"
    if low >= high:
        return f"{kind} needs low < high, got {show(args)}"
    if kind == "loguniform" and low <= 0:
        return f"loguniform needs low > 0 (it samples in log space), got {show(args)}"
    return None


def sample(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The sampled points of a valid [sweep.random] table, in order: dotted key -> value, keys sorted."""
    if not table:
        return []
    rng = random.Random(int(table.get("seed", 0)))
    keys = dist_keys(table)
    return [{key: _draw(rng, table[key]) for key in keys} for _ in range(int(table["n"]))]


def _draw(rng: random.Random, spec: dict[str, Any]) -> Any:
    ((kind, args),) = spec.items()
    if kind == "choice":
        return rng.choice(args)
    low, high = args
    if kind == "int":
        return rng.randint(low, high)
    if kind == "uniform":
        value = rng.uniform(low, high)
    else:
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    return min(max(float(f"{value:.{DIGITS}g}"), float(low)), float(high))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
