"""Bad input: one line naming the key and the fix, the right exit code, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobgen.cli import main

BASE = """
[experiment]
name = "bad"

[slurm]
nodes = 1
gpus_per_node = 1
time = "01:00:00"

[train]
engine = "lightning"
model = "distilbert-base-uncased"

[data]
dataset = "imdb"
"""


def with_lines(**sections: str) -> str:
    """BASE plus extra lines appended to sections (TOML allows a table once, so we splice)."""
    text = BASE
    for section, lines in sections.items():
        header = f"[{section}]\n"
        text = text.replace(header, header + lines + "\n") if header in text else text + f"\n{header}{lines}\n"
    return text


# (id, experiment text, expected exit code, words the message must contain)
CASES = [
    ("toml-syntax", BASE + "\n[train\n", 1, ["TOML syntax error", "line"]),
    ("toml-duplicate-key", with_lines(train="epochs = 1\nepochs = 2"), 1, ["TOML syntax error"]),
    ("unknown-section", BASE + "\n[trian]\nepochs = 1\n", 1, ["trian", "did you mean 'train'"]),
    ("unknown-key", with_lines(train="epoch = 3"), 1, ["train.epoch", "did you mean 'epochs'"]),
    ("unknown-slurm-key", with_lines(slurm="gpus = 4"), 1, ["slurm.gpus", "unknown key"]),
    ("section-not-table", "train = 3\n", 1, ["train", "must be a table"]),
    ("epochs-string", with_lines(train='epochs = "3"'), 1, ["train.epochs", "expected int"]),
    ("epochs-zero", with_lines(train="epochs = 0"), 1, ["train.epochs", "positive"]),
    ("batch-negative", with_lines(train="batch_size = -1"), 1, ["train.batch_size", "positive"]),
    ("nodes-zero", BASE.replace("nodes = 1", "nodes = 0"), 1, ["slurm.nodes", "positive"]),
    (
        "gpus-negative",
        BASE.replace("gpus_per_node = 1", "gpus_per_node = -2"),
        1,
        ["slurm.gpus_per_node", "zero or more"],
    ),
    ("cpus-zero", with_lines(slurm="cpus_per_task = 0"), 1, ["slurm.cpus_per_task", "positive"]),
    ("lr-string", with_lines(train='lr = "fast"'), 1, ["train.lr", "expected float"]),
    ("compile-string", with_lines(train='compile = "yes"'), 1, ["train.compile", "expected bool"]),
    ("peft-unknown", with_lines(train='peft = "qlora"'), 1, ["train.peft", "not one of none, lora"]),
    ("lora-r-zero", with_lines(train='peft = "lora"\nlora_r = 0'), 1, ["train.lora_r", "positive"]),
    ("lora-dropout-one", with_lines(train="lora_dropout = 1.0"), 1, ["train.lora_dropout", "at most 0.9"]),
    ("lora-modules-string", with_lines(train='lora_target_modules = "q_proj"'), 1, ["train.lora_target_modules"]),
    ("lora-module-name", with_lines(train='lora_target_modules = ["q proj"]'), 1, ["'q proj' is not a module name"]),
    (
        "lora-on-the-head",
        with_lines(train='peft = "lora"\nlora_target_modules = ["q_proj", "score"]'),
        1,
        ["train.lora_target_modules", "'score', the classification head", "leave it out"],
    ),
    (
        "lora-layer-the-builtin-lacks",
        BASE.replace('"distilbert-base-uncased"', '"builtin:tiny-decoder"').replace(
            "[train]\n", '[train]\npeft = "lora"\nlora_target_modules = ["q_lin"]\n'
        ),
        1,
        ["train.lora_target_modules", "'q_lin', which builtin:tiny-decoder has not", "q_proj"],
    ),
    (
        "builtin-decoder-typo",
        BASE.replace('"distilbert-base-uncased"', '"builtin:tiny-decodr"'),
        1,
        ["builtin:tiny-decoder"],
    ),
    ("time-words", BASE.replace('"01:00:00"', '"2 hours"'), 1, ["slurm.time", "HH:MM:SS"]),
    ("time-too-many-parts", BASE.replace('"01:00:00"', '"1:2:3:4"'), 1, ["slurm.time", "not a Slurm time"]),
    ("time-int", BASE.replace('"01:00:00"', "60"), 1, ["slurm.time", "expected str"]),
    ("mem-suffix", with_lines(slurm='mem = "64GB"'), 1, ["slurm.mem", "64G"]),
    ("mem-words", with_lines(slurm='mem = "lots"'), 1, ["slurm.mem", "memory size"]),
    ("strategy-typo", with_lines(train='strategy = "fdsp"'), 1, ["train.strategy", "did you mean 'fsdp'"]),
    ("precision-unknown", with_lines(train='precision = "fp8"'), 1, ["train.precision", "32-true"]),
    (
        "engine-unknown",
        BASE.replace('engine = "lightning"', 'engine = "keras"'),
        1,
        ["train.engine", "torch, lightning, fabric, hf_trainer"],
    ),
    ("backend-unknown", with_lines(launch='backend = "slurm"'), 1, ["launch.backend", "sbatch"]),
    ("accelerator-unknown", with_lines(train='accelerator = "tpu"'), 1, ["train.accelerator", "auto, gpu, cpu"]),
    (
        "tasks-not-devices",
        BASE.replace("gpus_per_node = 1", "gpus_per_node = 4\nntasks_per_node = 1"),
        1,
        ["ntasks_per_node = 1", "one task per device"],
    ),
    (
        "torch-with-fsdp",
        BASE.replace("gpus_per_node = 1", "gpus_per_node = 4")
        .replace('"lightning"', '"torch"')
        .replace("[train]\n", '[train]\nstrategy = "fsdp"\n'),
        1,
        ["train.strategy = 'fsdp'", "one device or DDP"],
    ),
    (
        "torch-ddp-on-4-gpus",
        with_lines(train='strategy = "ddp"')
        .replace('"lightning"', '"torch"')
        .replace("gpus_per_node = 1", "gpus_per_node = 4"),
        0,
        [],
    ),
    ("deepspeed-one-device", with_lines(train='strategy = "deepspeed_stage_2"'), 1, ["deepspeed_stage_2", "one"]),
    ("fsdp-one-device", with_lines(train='strategy = "fsdp"'), 1, ["fsdp", "one"]),
    (
        "fabric-deepspeed-accum",
        with_lines(train='strategy = "deepspeed_stage_2"\ngrad_accum = 2')
        .replace('"lightning"', '"fabric"')
        .replace("gpus_per_node = 1", "gpus_per_node = 2"),
        1,
        ["train.grad_accum = 2", "engine 'lightning'"],
    ),
    ("fsdp-offload-one-device", with_lines(train='strategy = "fsdp_offload"'), 1, ["fsdp_offload", "one"]),
    ("num-nodes-mismatch", with_lines(train="num_nodes = 2"), 1, ["train.num_nodes = 2", "slurm.nodes = 1"]),
    ("valid-4-gpus-control", BASE.replace("gpus_per_node = 1", "gpus_per_node = 4"), 0, []),
    ("devices-vs-gpus", with_lines(train="devices = 2"), 1, ["train.devices = 2", "slurm.gpus_per_node = 1"]),
    ("template-missing", with_lines(launch='template = "nope.j2"'), 1, ["launch.template", "not found"]),
    (
        "data-file-missing",
        BASE.replace('dataset = "imdb"', 'files = { train = "missing.csv" }'),
        1,
        ["data.files.train", "not found"],
    ),
    (
        "data-file-bad-split",
        BASE.replace('dataset = "imdb"', 'files = { dev = "x.csv" }'),
        1,
        ["data.files", "'dev' is not a split"],
    ),
    ("no-data", BASE.replace('dataset = "imdb"', ""), 1, ["data.dataset", "no data"]),
    ("sweep-empty-values", BASE + '\n[sweep.grid]\n"train.strategy" = []\n', 1, ["sweep.grid", "no values"]),
    ("sweep-unknown-key", BASE + '\n[sweep.grid]\n"train.strategyy" = ["ddp"]\n', 1, ["did you mean 'train.strategy'"]),
    ("sweep-not-sweepable", BASE + '\n[sweep.grid]\n"launch.backend" = ["local"]\n', 1, ["not a sweepable key"]),
    (
        "sweep-section-misspelt",
        BASE + '\n[sweep.grid]\n"trian.lr" = [1e-5]\n',
        1,
        ["not a sweepable key", "did you mean 'train.lr'"],
    ),
    ("sweep-key-without-section", BASE + '\n[sweep.grid]\n"lr" = [1e-5]\n', 1, ["did you mean 'train.lr'"]),
    (
        "sweep-point-misspelt",
        BASE + '\n[[sweep.points]]\n"train.epoch" = 1\n',
        1,
        ["did you mean 'train.epochs'"],
    ),
    (
        "sweep-too-large",
        BASE
        + '\n[sweep.grid]\n"train.seed" = [{}]\n"train.lr" = [{}]\n'.format(
            ", ".join(str(i) for i in range(200)), ", ".join(f"{i}e-5" for i in range(1, 60))
        ),
        1,
        ["11800 jobs", "sweep.max_jobs"],
    ),
    (
        "sweep-point-bad-value",
        BASE + '\n[sweep.grid]\n"train.precision" = ["bf16-mixed", "fp8"]\n',
        1,
        ["sweep point 1", "train.precision", "'fp8'"],
    ),
    (
        "sweep-point-bad-shape",
        BASE + '\n[[sweep.points]]\nname = "big"\n"slurm.gpus_per_node" = 4\n"slurm.ntasks_per_node" = 2\n',
        1,
        ["sweep point 0 (big)", "one task per device"],
    ),
    ("sweep-point-bad-name", BASE + '\n[[sweep.points]]\nname = "a b"\n', 1, ["sweep.points", "'a b'"]),
    ("signal-kill", with_lines(slurm='signal = "KILL"'), 1, ["slurm.signal", "USR2"]),
    ("extra-managed", with_lines(slurm='extra = { output = "x.log" }'), 1, ["slurm.extra", "set by jobgen"]),
    ("extra-dashes", with_lines(slurm='extra = { "--mail-type" = "END" }'), 1, ["slurm.extra", "write mail-type"]),
    ("extra-underscore", with_lines(slurm='extra = { mail_type = "END" }'), 1, ["slurm.extra", "write mail-type"]),
    ("extra-misspelt", with_lines(slurm='extra = { nodelst = "n1" }'), 1, ["slurm.extra", "did you mean 'nodelist'"]),
    ("valid-extra-unknown-to-this-list", with_lines(slurm='extra = { gpu-flavour = "x" }'), 0, []),
    ("secret-in-vars", BASE + '\n[env]\nvars = { HF_TOKEN = "hf_abcdef" }\n', 1, ["env.vars.HF_TOKEN", "secret"]),
    ("env-bad-name", BASE + '\n[env]\nvars = { "1X" = "y" }\n', 1, ["env.vars.1X", "not a valid"]),
    ("partition-two", with_lines(data="partition = [1, 2]"), 1, ["data.partition", "three"]),
    ("partition-fractions", with_lines(data="partition = [0.8, 0.2, 0.2]"), 1, ["data.partition", "sum"]),
    ("partition-string", with_lines(data='partition = "35k"'), 1, ["data.partition", "expected a list"]),
    ("name-chars", BASE.replace('name = "bad"', 'name = "my exp!"'), 1, ["experiment.name", "letters"]),
    (
        "local-two-nodes",
        BASE.replace("nodes = 1", "nodes = 2") + '\n[launch]\nbackend = "local"\n',
        1,
        ["backend = 'local'", "slurm.nodes = 2"],
    ),
    (
        "gpu-without-gpus",
        BASE.replace("gpus_per_node = 1", "gpus_per_node = 0").replace(
            'engine = "lightning"', 'engine = "lightning"\naccelerator = "gpu"'
        ),
        1,
        ["accelerator = 'gpu'"],
    ),
    (
        "gpu-type-without-gpus",
        BASE.replace("gpus_per_node = 1", 'gpus_per_node = 0\ngpu_type = "a100"'),
        1,
        ["gpu_type", "gpus_per_node > 0"],
    ),
    ("encoding-unknown", with_lines(data='encoding = "klingon"'), 1, ["data.encoding", "latin-1"]),
    ("array-parallelism-alone", with_lines(launch="array_parallelism = 4"), 1, ["launch.array = true"]),
    ("max-length-tiny", with_lines(data="max_length = 4"), 1, ["data.max_length", "at least 8"]),
    ("module-with-space", BASE + '\n[env]\nmodules = ["cuda 12"]\n', 1, ["env.modules", "one name per"]),
    (
        "launcher-unknown",
        with_lines(launch='launcher = "mpirun"'),
        1,
        ["launch.launcher", "srun, torchrun, accelerate"],
    ),
    (
        "torchrun-task-per-device",
        BASE.replace("gpus_per_node = 1", "gpus_per_node = 4\nntasks_per_node = 4")
        + '\n[launch]\nlauncher = "torchrun"\n',
        1,
        ["ntasks_per_node = 4", "one task per node", "= 1 (or 0)"],
    ),
    (
        "accelerate-under-submitit",
        with_lines(launch='launcher = "accelerate"\nbackend = "submitit"'),
        1,
        ["launch.launcher = 'accelerate'", "sbatch"],
    ),
    ("lightning-under-accelerate", with_lines(launch='launcher = "accelerate"'), 1, ["'lightning'", "torchrun"]),
    # Accepted since the engine shards with FSDP2 itself on CPU ranks (tests/training/test_hf_trainer_fsdp.py).
    (
        "hf-trainer-fsdp-on-cpu",
        BASE.replace("gpus_per_node = 1", "gpus_per_node = 2")
        .replace('"lightning"', '"hf_trainer"')
        .replace("[train]\n", '[train]\nstrategy = "fsdp"\naccelerator = "cpu"\n'),
        0,
        [],
    ),
    (
        "metric-of-another-problem-type",
        with_lines(data='problem_type = "regression"\nprimary_metric = "mcc"'),
        1,
        ["data.primary_metric", "'mcc' is not scored for regression", "pearson, spearman, mse"],
    ),
    (
        "metric-of-the-preset-s-problem-type",
        with_lines(data='preset = "glue/stsb"\nprimary_metric = "accuracy"'),
        1,
        ["data.primary_metric", "'accuracy' is not scored for regression"],
    ),
    ("unknown-preset", with_lines(data='preset = "glue/colaa"'), 1, ["data.preset", "did you mean 'glue/cola'"]),
    ("unknown-problem-type", with_lines(data='problem_type = "binary"'), 1, ["data.problem_type", "is not one of"]),
    ("glue-preset", with_lines(data='preset = "glue/mnli"'), 0, []),
    (
        "accelerate-with-hf-trainer",
        with_lines(launch='launcher = "accelerate"').replace('"lightning"', '"hf_trainer"'),
        0,
        [],
    ),
]


@pytest.mark.parametrize(("text", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_experiment(tmp_path: Path, runner, text: str, code: int, words: list[str]):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    root = tmp_path / "runs"
    for argv in (["validate", str(path)], ["--output-root", str(root), "submit", str(path), "--dry-run"]):
        result = runner.invoke(main, argv)
        assert result.exit_code == code, result.output
        if code == 0:
            continue
        lines = result.output.strip().splitlines()
        assert len(lines) == 1, result.output
        assert "Traceback" not in result.output and lines[0].startswith("Error: ")
        for word in words:
            assert word in lines[0], f"{word!r} not in {lines[0]!r}"
        assert not root.exists() or not any(root.rglob("*")), "a failed submit left files behind"


def test_at_least_forty_cases():
    assert sum(1 for c in CASES if c[2] != 0) >= 40


USAGE = [
    ("no-args", ["submit"], "missing EXPERIMENT"),
    ("show-without-dry-run", ["submit", "experiments/local_demo.toml", "--show"], "--show goes with --dry-run"),
    ("unknown-option", ["submit", "--dry", "x.toml"], "No such option"),
    ("bad-backend-choice", ["submit", "x.toml", "--backend", "pbs"], "Invalid value for '--backend'"),
    ("unknown-command", ["sumbit"], "No such command"),
]


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in USAGE], ids=[c[0] for c in USAGE])
def test_usage_errors_exit_2(runner, argv, words):
    result = runner.invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_missing_file_and_not_utf8(tmp_path: Path, runner):
    result = runner.invoke(main, ["validate", str(tmp_path / "nope.toml")])
    assert result.exit_code == 1 and "no such experiment file" in result.output
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    result = runner.invoke(main, ["validate", str(binary)])
    assert result.exit_code == 1 and "UTF-8" in result.output and len(result.output.strip().splitlines()) == 1


def test_debug_shows_the_traceback(tmp_path: Path, runner):
    path = tmp_path / "exp.toml"
    path.write_text(with_lines(train="epochs = 0"))
    result = runner.invoke(main, ["--debug", "validate", str(path)])
    assert result.exit_code == 1
    assert "Traceback" in result.output and "train.epochs" in result.output


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{{ nope }}\n", ["my.j2", "'nope' is undefined"]),
        ("{% if %}\n", ["my.j2:1", "Expected an expression"]),
        ('{% extends "missing.j2" %}\n', ["'missing.j2' not found"]),
    ],
)
def test_bad_user_template(tmp_path: Path, runner, template: str, words: list[str]):
    (tmp_path / "my.j2").write_text(template)
    path = tmp_path / "exp.toml"
    path.write_text(with_lines(launch='template = "my.j2"'))
    root = tmp_path / "runs"
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), "--dry-run"])
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    for word in words:
        assert word in line, line
    assert not root.exists() or not any(root.rglob("*"))


def test_user_template_extends_or_replaces(tmp_path: Path, runner):
    (tmp_path / "ext.j2").write_text(
        '{% extends "srun.sbatch.j2" %}\n{% block launch %}echo {{ job_name | shquote }}\n{% endblock %}\n'
    )
    (tmp_path / "own.j2").write_text("#!/bin/bash\necho {{ spec_path | shquote }}\n")
    for name, expect in (("ext.j2", "#SBATCH --nodes=1"), ("own.j2", "spec.json")):
        path = tmp_path / f"{name}.toml"
        path.write_text(with_lines(launch=f'template = "{name}"'))
        result = runner.invoke(main, ["--output-root", str(tmp_path / "o"), "submit", str(path), "--dry-run", "--show"])
        assert result.exit_code == 0, result.output
        assert expect in result.output


SWEPT = BASE + '\n[sweep.grid]\n"train.seed" = [1, 2]\n'
# (id, --set items, words the one-line message must contain)
SETS = [
    ("set-no-equals", ["train.epochs"], ["--set 'train.epochs'", "KEY=VALUE"]),
    ("set-no-section", ["epochs=1"], ["--set 'epochs=1'", "dotted key"]),
    ("set-empty-part", ["train..epochs=1"], ["--set 'train..epochs=1'"]),
    ("set-unknown-key", ["train.epoch=2"], ["--set: train.epoch", "did you mean 'epochs'"]),
    ("set-bad-value", ["train.epochs=0"], ["--set: train.epochs", "positive"]),
    ("set-wrong-type", ["train.lr=fast"], ["--set: train.lr", "expected float", "'fast'"]),
    ("set-bad-choice", ["train.strategy=fdsp"], ["--set: train.strategy", "did you mean 'fsdp'"]),
    ("set-swept-key", ["train.seed=3"], ["--set train.seed", "the sweep sets 'train.seed'"]),
    ("set-sweep", ["sweep.grid=1"], ["--set sweep.grid", "[sweep]"]),
    ("set-into-a-value", ["slurm.time.x=1"], ["--set slurm.time.x", "'time' is not a table"]),
    ("set-table-for-value", ["train.epochs.x=1"], ["--set: train.epochs", "expected int, got table"]),
]


MALFORMED_SETS = {"train.epochs", "epochs=1", "train..epochs=1", "sweep.grid=1"}


@pytest.mark.parametrize(("sets", "words"), [c[1:] for c in SETS], ids=[c[0] for c in SETS])
def test_bad_set(tmp_path: Path, runner, sets: list[str], words: list[str]):
    path = tmp_path / "exp.toml"
    path.write_text(SWEPT)
    root = tmp_path / "runs"
    flags = [arg for item in sets for arg in ("--set", item)]
    for argv in (
        ["validate", str(path), *flags],
        ["--output-root", str(root), "submit", str(path), "--dry-run", *flags],
    ):
        result = runner.invoke(main, argv)
        # not KEY=VALUE with a dotted key (or a sweep key) is a usage error; a value the key refuses is not
        assert result.exit_code == (2 if sets[0] in MALFORMED_SETS else 1), result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
        for word in words:
            assert word in lines[0], f"{word!r} not in {lines[0]!r}"
        assert not root.exists() or not any(root.rglob("*")), "a failed submit left files behind"


@pytest.mark.parametrize(("launcher", "tasks"), [("srun", 4), ("torchrun", 1), ("accelerate", 1)])
def test_each_launcher_gets_its_tasks_per_node(launcher: str, tasks: int, tmp_path: Path):
    """srun: one task per device; torchrun and accelerate: one task per node, which starts the rest."""
    from jobgen.experiment.config import load
    from jobgen.plan.plan import plan

    path = tmp_path / "exp.toml"
    text = BASE.replace("gpus_per_node = 1", "gpus_per_node = 4").replace('"lightning"', '"hf_trainer"')
    path.write_text(text + f'\n[launch]\nlauncher = "{launcher}"\n')
    (job,) = plan(load(path))
    assert job.ntasks_per_node == tasks and job.devices == 4


@pytest.mark.parametrize(
    ("sweep", "bad"),
    [
        (
            '[[sweep.points]]\nname = "a"\n"train.epochs" = 1\n\n[[sweep.points]]\nname = "b"\n"train.epochs" = -3\n',
            '"train.epochs" = -3',
        ),
        ('[sweep.grid]\n"train.seed" = [1, 2]\n"train.batch_size" = [8, 0]\n', '"train.batch_size" = [8, 0]'),
        ('[sweep]\ngrid."train.lr" = [1e-5, -1.0]\n', 'grid."train.lr" = [1e-5, -1.0]'),
    ],
    ids=["point", "grid", "dotted-grid"],
)
def test_an_error_in_a_sweep_cites_the_line_that_gave_the_value(tmp_path: Path, runner, sweep: str, bad: str):
    text = BASE + "\n" + sweep
    path = tmp_path / "exp.toml"
    path.write_text(text)
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    line = next(n for n, ln in enumerate(text.splitlines(), start=1) if ln.strip() == bad)
    assert f"exp.toml:{line}: sweep point" in result.output, (line, result.output)


def _written_run(tmp_path: Path, dry_run: bool = False) -> Path:
    """A run as submit writes it (not queued: a real run, never a dry one unless asked)."""
    from jobgen.commands.submit import prepare

    path = tmp_path / "exp.toml"
    path.write_text(SWEPT)
    return prepare(path, tmp_path / "runs", dry_run=dry_run).run_dir


def _garble(run: Path, rel: str) -> None:
    (run / rel).write_text("{ not json")


# (id, what is done to a written run, JOB and option arguments, words the one-line message must contain)
RERUNS = [
    ("rerun-dry-run", lambda run: None, ["--dry-run-source"], ["is a dry run", "nothing to repeat"]),
    ("rerun-unknown-job", lambda run: None, ["seed-9"], ["no job 'seed-9'", "jobs: seed-1, seed-2"]),
    ("rerun-damaged-manifest", lambda run: _garble(run, "manifest.json"), [], ["manifest.json: damaged"]),
    ("rerun-damaged-spec", lambda run: _garble(run, "jobs/seed-1/spec.json"), [], ["spec.json", "cannot be repeated"]),
    ("rerun-missing-script", lambda run: (run / "jobs/seed-2/job.sbatch").unlink(), [], ["job.sbatch", "cannot be"]),
    ("rerun-set-unknown-key", lambda run: None, ["--set", "train.epoch=2"], ["--set: train.epoch", "did you mean"]),
    ("rerun-set-swept-key", lambda run: None, ["--set", "train.seed=3"], ["--set train.seed", "the sweep sets"]),
]


@pytest.mark.parametrize(("damage", "args", "words"), [c[1:] for c in RERUNS], ids=[c[0] for c in RERUNS])
def test_bad_rerun(tmp_path: Path, runner, damage, args: list[str], words: list[str]):
    dry = "--dry-run-source" in args
    run = _written_run(tmp_path, dry_run=dry)
    damage(run)
    before = sorted(run.parent.iterdir())
    argv = [a for a in args if a != "--dry-run-source"]
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "rerun", str(run), *argv])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    assert sorted(run.parent.iterdir()) == before, "a refused rerun wrote a run"


def test_rerun_of_no_run(tmp_path: Path, runner):
    result = runner.invoke(main, ["--output-root", str(tmp_path), "rerun", "nothing-here"])
    assert result.exit_code == 1 and "no run found for 'nothing-here'" in result.output
    assert len(result.output.strip().splitlines()) == 1


# (id, call of jobgen.api with a value of the wrong type, words its BadArgument must contain)
API_CALLS = [
    ("load-path-int", lambda api, exp: api.load(3), ["jobgen.api.load: path must be a path", "not int 3"]),
    ("load-sets-str", lambda api, exp: api.load(exp, "train.epochs=1"), ["sets must be a list", "not one string"]),
    ("load-sets-ints", lambda api, exp: api.load(exp, [1]), ["sets must be a list of strings", "list [1]"]),
    ("load-site-int", lambda api, exp: api.load(exp, site=1), ["site must be a string or None"]),
    ("plan-path", lambda api, exp: api.plan(exp), ["jobgen.api.plan: experiment must be an Experiment"]),
    ("submit-path", lambda api, exp: api.submit(exp), ["jobgen.api.submit: experiment must be an Experiment"]),
    ("submit-dry-str", lambda api, exp: api.submit(api.load(exp), dry_run="yes"), ["dry_run must be True or False"]),
    ("get-run-int", lambda api, exp: api.get_run(5), ["jobgen.api.get_run: ref must be a path"]),
    ("rerun-path", lambda api, exp: api.rerun(exp), ["jobgen.api.rerun: run must be a Run"]),
    ("run-bytes", lambda api, exp: api.Run(b"/tmp"), ["jobgen.api.Run: path must be a path"]),
]


@pytest.mark.parametrize(("call", "words"), [c[1:] for c in API_CALLS], ids=[c[0] for c in API_CALLS])
def test_api_wrong_types(tmp_path: Path, call, words: list[str]):
    from jobgen import api
    from jobgen.errors import BadArgument

    path = tmp_path / "exp.toml"
    path.write_text(SWEPT)
    with pytest.raises(BadArgument) as caught:
        call(api, path)
    assert isinstance(caught.value, TypeError) and "\n" not in caught.value.message
    for word in words:
        assert word in caught.value.message, caught.value.message
    assert not (tmp_path / "runs").exists()


def test_api_errors_are_jobgen_errors_not_exits(tmp_path: Path):
    from jobgen import api
    from jobgen.errors import ConfigError, DriftError, JobgenError, RunNotFound

    path = tmp_path / "exp.toml"
    path.write_text(with_lines(train="epochs = 0"))
    with pytest.raises(ConfigError, match="train.epochs"):
        api.load(path)
    with pytest.raises(RunNotFound):
        api.get_run("nothing", output_root=tmp_path)
    run = api.Run(_written_run(tmp_path))
    with pytest.raises(JobgenError, match="no job 'x'"):
        run.rerun(["x"])
    import shutil

    shutil.rmtree(run.path / "code" / "training")
    with pytest.raises(DriftError) as drift:
        run.rerun(dry_run=True)
    assert drift.value.drift[0].endswith("instead") and "code snapshot is missing" in drift.value.drift[0]
