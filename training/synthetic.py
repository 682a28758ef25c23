"""A deterministic, sentiment-like toy corpus with a clear learnable signal.

Used by the local demo, the tests and the benchmark: no download, same texts for the same seed.
Each text mixes neutral filler with a few polar words; the label is the polarity that appears more.
`lengths="imdb"` draws word counts from a log-normal shaped like IMDB reviews (median ~ 180 words,
long tail), which is what makes padding strategies differ.
"""

from __future__ import annotations

import math
import random

POSITIVE = (
    "good great excellent wonderful superb lovely brilliant enjoyable delightful moving charming fantastic"
).split()
NEGATIVE = ("bad awful terrible boring dreadful poor weak dull horrible painful clumsy disappointing").split()
FILLER = (
    "the a movie film story actor plot scene it was and of with this that director music "
    "character ending script camera cast one really quite very some part time"
).split()
LABELS = ("negative", "positive")
DEFAULT_SIZES = (2000, 500, 500)


def _word_count(rng: random.Random, lengths: str) -> int:
    if lengths == "imdb":
        # IMDB reviews: median ~ 175 words, 90th percentile ~ 450, a few above 1000.
        return max(10, min(1500, int(rng.lognormvariate(math.log(175), 0.75))))
    return rng.randint(6, 30)


def _text(rng: random.Random, label: int, lengths: str) -> str:
    words = [rng.choice(FILLER) for _ in range(_word_count(rng, lengths))]
    own, other = (POSITIVE, NEGATIVE) if label == 1 else (NEGATIVE, POSITIVE)
    polar = [rng.choice(own) for _ in range(rng.randint(2, 4))]
    polar += [rng.choice(other) for _ in range(rng.randint(0, 1))]
    for word in polar:
        words.insert(rng.randrange(len(words) + 1), word)
    return " ".join(words)


def make_rows(n: int, seed: int = 0, lengths: str = "short") -> dict[str, list[str]]:
    """n rows as columns {"text": [...], "label": [...]} with string labels, balanced classes."""
    rng = random.Random(f"synthetic-{seed}-{lengths}")
    labels = [i % 2 for i in range(n)]
    rng.shuffle(labels)
    return {"text": [_text(rng, y, lengths) for y in labels], "label": [LABELS[y] for y in labels]}
