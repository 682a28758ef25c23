"""The built-in models, built offline: builtin:tiny is the same wherever it is built;
builtin:distilbert-shape is distilbert-base-uncased's architecture with random weights."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import spec_dict
from training import data
from training.spec import from_dict

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]


def test_distilbert_shape_has_distilberts_parameters_and_layout(tmp_path: Path, cache_dir: Path) -> None:
    from transformers import AutoConfig

    from training import model as model_lib

    spec = from_dict(
        spec_dict(
            tmp_path / "job", cache_dir, train={"model": "builtin:distilbert-shape"}, data={"partition": [60, 10, 10]}
        )
    )
    prepared = data.prepare(spec)
    assert Path(prepared.model_source).parent.name == "distilbert-shape"
    config = AutoConfig.from_pretrained(prepared.model_source)
    assert (config.n_layers, config.n_heads, config.dim, config.hidden_dim) == (6, 12, 768, 3072)
    assert config.vocab_size == 30522 and config.max_position_embeddings == 512
    model = model_lib.load_model(prepared.model_source, prepared.label_names)
    # distilbert-base-uncased with a 2-class head (AutoModelForSequenceClassification), as the hub's has
    assert sum(p.numel() for p in model.parameters()) == 66_955_010
    ids = prepared.tokenizer("a good film")["input_ids"]
    assert max(ids) < config.vocab_size  # the tokenizer made from the texts fits the embedding


def test_jobgen_accepts_both_builtin_models_and_names_them(runner, tmp_path: Path) -> None:
    from jobgen.cli import main

    demo = Path(__file__).resolve().parents[2] / "experiments" / "local_demo.toml"
    ok = runner.invoke(main, ["validate", str(demo), "--set", "train.model=builtin:distilbert-shape"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, ["validate", str(demo), "--set", "train.model=builtin:bert"])
    assert bad.exit_code != 0 and "builtin:tiny, builtin:tiny-decoder, builtin:distilbert-shape" in bad.output


BUILD = """
import sys
from training import model, synthetic
rows = synthetic.make_rows(2000, seed=0, lengths="imdb")
model.build_tiny(rows["text"], ["negative", "positive"], __import__("pathlib").Path(sys.argv[1]), seed=7)
"""


def test_builtin_tiny_is_the_same_wherever_it_is_built(tmp_path: Path) -> None:
    """Two builds of one corpus, in two processes (as two clusters, or a cache built again, do): the same
    tokenizer and the same weights, so one seed gives one result. The tokenizers library's WordPiece
    trainer gave a different vocabulary in each process."""
    root = Path(__file__).resolve().parents[2]
    digests = []
    for n in range(2):
        env = {"PYTHONPATH": str(root), "PYTHONHASHSEED": str(n), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / f"tiny{n}")], env=env, check=True, timeout=120)
        files = ("tokenizer.json", "config.json", "model.safetensors")
        digests.append({f: hashlib.sha256((tmp_path / f"tiny{n}" / f).read_bytes()).hexdigest() for f in files})
    assert digests[0] == digests[1]
    from training import model as model_lib

    tokenizer = model_lib.load_tokenizer(str(tmp_path / "tiny0"))
    # Common words whole; a word the texts lack, in their letters; a character they lack, unknown.
    assert tokenizer.tokenize("The film was wonderful, tacos!") == [
        *("the", "film", "was", "wonderful"),
        *("[UNK]", "t", "##a", "##c", "##o", "##s", "[UNK]"),
    ]
