"""[container]: bad keys are one-line errors naming the key; the mapping onto the launch keeps what talks
to Slurm on the host; sites and partials of one's own plug in. (Golden scripts: tests/core/test_golden.py;
a real job in a real container: tests/slurm/test_container.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.commands.submit import launch_lines

BASE = """
[experiment]
name = "ct"

[slurm]
gpus_per_node = 2

[train]
engine = "torch"
model = "builtin:tiny"

[data]
dataset = "builtin:synthetic"
"""

# (id, [container] lines, extra TOML, the key the message names, words it must also hold)
BAD = [
    ("unknown-runtime", 'runtime = "docker"\nimage = "x"', "", "container.runtime", ["apptainer, singularity, pyxis"]),
    ("runtime-not-text", "runtime = 3", "", "container.runtime", ["expected str"]),
    ("image-without-runtime", 'image = "img.sif"', "", "container.runtime", ["no runtime"]),
    ("runtime-without-image", 'runtime = "apptainer"', "", "container.image", ["needs an image"]),
    ("pyxis-relative-squashfs", 'runtime = "pyxis"\nimage = "images/pt.sqsh"', "", "container.image", ["'./"]),
    ("apptainer-missing-image", 'runtime = "apptainer"\nimage = "nope.sif"', "", "container.image", ["no such"]),
    ("charliecloud-missing-dir", 'runtime = "charliecloud"\nimage = "/nope/img"', "", "container.image", ["no such"]),
    ("mount-comma", 'runtime = "pyxis"\nimage = "ubuntu"\nmounts = ["/tmp,/usr"]', "", "container.mounts[0]", ["','"]),
    ("mount-colon", 'runtime = "pyxis"\nimage = "ubuntu"\nmounts = ["/tmp:/a:b"]', "", "container.mounts[0]", ["':'"]),
    ("mount-newline", 'runtime = "pyxis"\nimage = "ubuntu"\nmounts = ["/tmp\\n/x"]', "", "container.mounts", ["\\n"]),
    ("mount-relative-dst", 'runtime = "pyxis"\nimage = "ubuntu"\nmounts = ["/tmp:x"]', "", "container.mounts[0]", []),
    ("mount-empty-dst", 'runtime = "pyxis"\nimage = "ubuntu"\nmounts = ["/tmp:"]', "", "container.mounts[0]", []),
    (
        "mount-missing",
        'runtime = "pyxis"\nimage = "ubuntu"\nmounts = ["/no/such"]',
        "",
        "container.mounts[0]",
        ["no such"],
    ),
    ("env-bad-name", 'runtime = "pyxis"\nimage = "ubuntu"\nenv = ["1ABC"]', "", "container.env[0]", ["variable name"]),
    ("env-two-names", 'runtime = "pyxis"\nimage = "ubuntu"\nenv = ["A", "B C"]', "", "container.env[1]", ["one name"]),
    ("unknown-key", 'runtime = "pyxis"\nimgae = "ubuntu"', "", "container.imgae", ["did you mean 'image'"]),
    (
        "pyxis-local-backend",
        'runtime = "pyxis"\nimage = "ubuntu"',
        '[launch]\nbackend = "local"',
        "container.runtime",
        ["srun", "sbatch"],
    ),
    (
        "runtime-not-installed-here",
        'runtime = "apptainer"\nimage = "docker://ubuntu"',
        '[launch]\nbackend = "local"',
        "container.runtime",
        ["apptainer", "PATH"],
    ),
    ("gpu-flags-text", 'runtime = "pyxis"\nimage = "ubuntu"\ngpu_flags = "yes"', "", "container.gpu_flags", []),
]


@pytest.mark.parametrize(("lines", "extra", "key", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_container_keys_are_one_line_naming_the_key(tmp_path, runner, monkeypatch, lines, extra, key, words):
    monkeypatch.setenv("PATH", str(tmp_path))  # no container runtime on this machine
    path = tmp_path / "ct.toml"
    path.write_text(f"{BASE}\n[container]\n{lines}\n{extra}\n")
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {path}") and "Traceback" not in line
    assert f": {key}: " in line, line
    for word in words:
        assert word in line, (word, line)


def _experiment(tmp_path: Path, container: str, extra: str = "") -> Path:
    path = tmp_path / "ct.toml"
    path.write_text(f"{BASE}\n[container]\n{container}\n{extra}\n")
    return path


def _dry_run(runner, path: Path, root: Path, *args: str) -> tuple[str, Path]:
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), "--dry-run", *args])
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "ct").iterdir()
    return result.output, run_dir


def test_pyxis_flags_go_on_the_srun_step_and_slurm_stays_on_the_host(tmp_path, runner):
    path = _experiment(tmp_path, 'runtime = "pyxis"\nimage = "nvcr.io#nvidia/pytorch:24.05-py3"\nenv = ["WANDB_MODE"]')
    output, run_dir = _dry_run(runner, path, tmp_path / "runs", "--set", "slurm.requeue=true")
    script = (run_dir / "jobs" / "ct" / "job.sbatch").read_text()
    launch = launch_lines(script)
    assert (
        launch[0].startswith("run_step srun ") and "--container-image='nvcr.io#nvidia/pytorch:24.05-py3'" in launch[2]
    )
    assert "#SBATCH --container" not in script  # the batch shell itself stays on the host
    # The run's output root is mounted at its own path, and jobgen's variables win over the image's.
    assert f"--container-mounts={tmp_path / 'runs'}:{tmp_path / 'runs'}," in launch[2]
    assert "--container-env=PYTHONUNBUFFERED,PYTHONPATH,JOBGEN_RUN_DIR," in launch[2] and ",WANDB_MODE " in launch[2]
    assert f"--container-workdir={run_dir / 'jobs' / 'ct'}" in launch[2]
    # scontrol (hostnames, requeue) and scancel run in the batch shell, never in the task's command.
    assert "scontrol requeue" in script and "scontrol show hostnames" in script
    assert not any("scontrol" in line or "scancel" in line for line in launch)
    # --dry-run shows the wrapped command; the manifest and the spec record runtime and image.
    assert "container: pyxis nvcr.io#nvidia/pytorch:24.05-py3" in output and "--container-image=" in output
    record = {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3"}
    assert json.loads((run_dir / "manifest.json").read_text())["container"] == record
    assert json.loads((run_dir / "jobs" / "ct" / "spec.json").read_text())["container"] == record


def test_apptainer_prefixes_the_python_of_each_task_with_nv_for_gpus(tmp_path, runner):
    (tmp_path / "img.sif").touch()
    path = _experiment(tmp_path, 'runtime = "singularity"\nimage = "img.sif"\nmounts = ["/tmp:/scratch"]')
    for gpus, nv in ((2, True), (0, False)):
        _, run_dir = _dry_run(runner, path, tmp_path / f"runs{gpus}", "--set", f"slurm.gpus_per_node={gpus}")
        launch = launch_lines((run_dir / "jobs" / "ct" / "job.sbatch").read_text())
        wrap = launch[2]
        assert wrap.lstrip().startswith("singularity exec ") and ("--nv" in wrap) == nv, wrap
        assert f" {tmp_path / 'img.sif'} " in wrap and "--bind /tmp:/scratch" in wrap, wrap
        assert launch[3].strip().startswith("python -u -m training --spec"), launch
        script = (run_dir / "jobs" / "ct" / "job.sbatch").read_text()
        assert 'export "SINGULARITYENV_${name}=${!name}"' in script


def test_a_user_mount_that_holds_the_output_root_replaces_its_own_mount(tmp_path, runner, monkeypatch):
    monkeypatch.delenv("HF_HOME", raising=False)
    (tmp_path / "img.sif").touch()
    path = _experiment(tmp_path, f'runtime = "apptainer"\nimage = "img.sif"\nmounts = ["{tmp_path}"]')
    _, run_dir = _dry_run(runner, path, tmp_path / "runs")
    script = (run_dir / "jobs" / "ct" / "job.sbatch").read_text()
    wrap = launch_lines(script)[2]
    assert f"--bind {tmp_path}:{tmp_path}" in wrap and f"--bind {tmp_path / 'runs'}:" not in wrap, wrap
    # The Hugging Face cache is still mounted, and made first on the node (a bind needs its source).
    hf = '"${HOME}"/.cache/huggingface'
    assert f"--bind {hf}:{hf}" in wrap and f"\nmkdir -p {hf}\n" in script


def test_a_runtime_of_ones_own_is_a_partial_beside_the_template(tmp_path, runner):
    (tmp_path / "site.sbatch.j2").write_text('{% extends "srun.sbatch.j2" %}\n')
    (tmp_path / "_container_podman.j2").write_text(
        "{% macro environment() %}{% endmacro %}\n{% macro srun_flags() %}{% endmacro %}\n"
        "{% macro command() %}podman run --rm {{ container.image | shquote }} {% endmacro %}\n"
    )
    path = _experiment(
        tmp_path, 'runtime = "podman"\nimage = "localhost/torch"', '[launch]\ntemplate = "site.sbatch.j2"'
    )
    _, run_dir = _dry_run(runner, path, tmp_path / "runs")
    launch = launch_lines((run_dir / "jobs" / "ct" / "job.sbatch").read_text())
    assert launch[2] == "    podman run --rm localhost/torch \\", launch
    # Without the partial, the runtime is refused and the choices are listed.
    (tmp_path / "_container_podman.j2").unlink()
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1 and "container.runtime: 'podman' is not one of apptainer" in result.output


def test_a_site_gives_container_defaults(tmp_path, runner, monkeypatch):
    (tmp_path / "img.sif").touch()
    # A relative image is relative to the sites file, not to each experiment.
    (tmp_path / "site").mkdir()
    sites = tmp_path / "site" / "sites.toml"
    sites.write_text('[sites.hpc1.container]\nruntime = "apptainer"\nimage = "../img.sif"\n')
    monkeypatch.setenv("JOBGEN_SITES_FILE", str(sites))
    path = tmp_path / "ct.toml"
    path.write_text(BASE)
    output, run_dir = _dry_run(runner, path, tmp_path / "runs", "--site", "hpc1")
    assert f"container: apptainer {tmp_path / 'img.sif'}" in output, output
    assert "apptainer exec --nv" in output
    # A site's bad container key names the site's key.
    sites.write_text('[sites.hpc1.container]\nruntime = "apptainr"\nimage = "x"\n')
    result = runner.invoke(main, ["validate", str(path), "--site", "hpc1"])
    assert result.exit_code == 1 and "sites.hpc1.container.runtime" in result.output, result.output


def test_submitit_gets_the_same_wrapping_as_words(tmp_path, runner, monkeypatch):
    """submitit writes its own srun line: the partial's flags go to its srun arguments (pyxis), its
    command words before the task's python (apptainer), ~ expanded on this machine."""
    import sys
    import types

    seen: dict = {}

    class Executor:
        def __init__(self, folder, cluster):
            pass

        def update_parameters(self, **params):
            seen["params"] = params

        def submit(self, command):
            seen["command"] = command.command
            return types.SimpleNamespace(job_id="4242")

    class CommandFunction:
        def __init__(self, command, verbose):
            self.command = command

    fake = types.ModuleType("submitit")
    fake.AutoExecutor = Executor
    helpers = types.ModuleType("submitit.helpers")
    helpers.CommandFunction = CommandFunction
    monkeypatch.setitem(sys.modules, "submitit", fake)
    monkeypatch.setitem(sys.modules, "submitit.helpers", helpers)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HOME", raising=False)
    (tmp_path / "img.sif").touch()
    hf = f"{tmp_path}/home/.cache/huggingface"
    for runtime, image in (("apptainer", "img.sif"), ("pyxis", "ubuntu:22.04")):
        path = _experiment(tmp_path, f'runtime = "{runtime}"\nimage = "{image}"', '[launch]\nbackend = "submitit"')
        root = tmp_path / f"runs-{runtime}"
        result = runner.invoke(main, ["--output-root", str(root), "submit", str(path)])
        assert result.exit_code == 0, result.output
        (run_dir,) = (root / "ct").iterdir()
        spec = str(run_dir / "jobs" / "ct" / "spec.json")
        srun_args = seen["params"]["slurm_srun_args"]
        if runtime == "apptainer":
            assert seen["command"][:3] == ["apptainer", "exec", "--nv"], seen["command"]
            assert f"{hf}:{hf}" in seen["command"] and str(tmp_path / "img.sif") in seen["command"]
            assert seen["command"][-6:] == ["python", "-u", "-m", "training", "--spec", spec]
            assert srun_args == ["--label", "--kill-on-bad-exit=1"]
        else:
            assert seen["command"] == ["python", "-u", "-m", "training", "--spec", spec]
            assert "--container-image=ubuntu:22.04" in srun_args, srun_args
            assert f"--container-mounts={root}:{root},{hf}:{hf}" in srun_args, srun_args


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp, which ch-run shares with the host (its folders need no mount point)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="jobgen-test-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_charliecloud_needs_a_mount_point_in_the_image_for_every_bind(outside_tmp, runner, monkeypatch):
    """ch-run binds only onto folders a read-only image has: validate names the mount that has none,
    submit the output root or the cache; with the mount points made, the job's ch-run line binds them."""
    tmp_path = outside_tmp
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    image, data, root = tmp_path / "image", tmp_path / "data", tmp_path / "runs"
    image.mkdir()
    data.mkdir()
    path = _experiment(tmp_path, f'runtime = "charliecloud"\nimage = "image"\nmounts = ["{data}"]')
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1 and f"container.mounts[0]: {data} (it) has no mount point" in result.output
    assert f"mkdir -p {image}{data}" in result.output
    (image / data.relative_to("/")).mkdir(parents=True)
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), "--dry-run"])
    assert result.exit_code == 1 and f"container.image: {root} (mounted by jobgen" in result.output, result.output
    assert not root.exists() or not any(root.rglob("*.sbatch"))
    for folder in (root, tmp_path / "hf"):
        (image / folder.relative_to("/")).mkdir(parents=True)
    _, run_dir = _dry_run(runner, path, root)
    wrap = launch_lines((run_dir / "jobs" / "ct" / "job.sbatch").read_text())[2]
    assert wrap.strip() == (
        f"ch-run --cd={run_dir / 'jobs' / 'ct'} --bind={root}:{root} --bind={tmp_path / 'hf'}:{tmp_path / 'hf'} "
        f"--bind={data}:{data} {image} -- \\"
    )


def test_diff_tells_runs_in_two_images_apart(tmp_path, runner):
    root = tmp_path / "runs"
    runs = []
    for image in ("nvcr.io#nvidia/pytorch:24.05-py3", "ubuntu:22.04"):
        path = _experiment(tmp_path, f'runtime = "pyxis"\nimage = "{image}"')
        result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), "--dry-run"])
        assert result.exit_code == 0, result.output
        runs.append(result.output.splitlines()[0].removeprefix("run: "))
    result = runner.invoke(main, ["diff", *runs])
    assert result.exit_code == 0, result.output
    assert "container.image  nvcr.io#nvidia/pytorch:24.05-py3  ->  ubuntu:22.04" in result.output


HOSTILE = ["a b", "it's", "$(touch pwned)", 'x"y', "back\\slash", "semi;colon", "star*", "-dash", "=eq"]


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "charliecloud"])
def test_hostile_mount_paths_reach_the_runtime_as_one_word_each(tmp_path, runner, monkeypatch, runtime):
    """Every mount path, however it is spelt, arrives at the runtime whole: bash reads the rendered
    words back into exactly the paths (and runs nothing)."""
    import subprocess

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "img.sif").touch()
    (tmp_path / "img").mkdir()
    folders = [tmp_path / name for name in HOSTILE]
    for folder in folders:
        folder.mkdir()
    mounts = ", ".join(json.dumps(str(f)) for f in folders)
    image = {"apptainer": "img.sif", "pyxis": "./img.sif", "charliecloud": "img"}[runtime]
    path = _experiment(tmp_path, f'runtime = "{runtime}"\nimage = "{image}"\nmounts = [{mounts}]')
    _, run_dir = _dry_run(runner, path, tmp_path / "runs")
    line = launch_lines((run_dir / "jobs" / "ct" / "job.sbatch").read_text())[2].strip().removesuffix("\\")
    done = subprocess.run(["bash", "-c", f"printf '%s\\n' {line}"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    words = done.stdout.splitlines()
    if runtime == "pyxis":
        (mount_word,) = [w for w in words if w.startswith("--container-mounts=")]
        pairs = mount_word.removeprefix("--container-mounts=").split(",")[2:]
        assert pairs == [f"{f}:{f}" for f in folders], pairs
    else:
        flag = "--bind" if runtime == "apptainer" else "--bind="
        got = [w.removeprefix(flag) for w in words if w.startswith("--bind")]
        if runtime == "apptainer":
            got = [words[i + 1] for i, w in enumerate(words) if w == "--bind"]
        assert got[2:] == [f"{f}:{f}" for f in folders], got
    assert not (tmp_path / "pwned").exists()
