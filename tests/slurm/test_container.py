"""A real job in a real Charliecloud container on the test cluster: [container] runtime = "charliecloud".

The image is a directory whose root holds only empty mount points, a marker file and a probe
(/opt/probe/python, a shell script that only the image has): ch-run binds the host's /usr and the
Python install into it, and jobgen binds the output root (which holds the run folder) and the
Hugging Face cache. So inside the container only what is bound is visible. The job trains (builtin:tiny,
builtin:synthetic, 1 rank, srun launcher); the probe records what the task saw, through the bind, in
the run folder. Everything lives outside /tmp, which ch-run shares with the host by default, and the
files the task must not see are ones the test makes there, so the test holds wherever the checkout is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import REPO, TINY_TRAIN, all_final, jobgen, manifest, only_run, wait_states, write_experiment

pytestmark = [pytest.mark.slurm, pytest.mark.training]

MARKER = "only in the image"


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A folder outside /tmp (ch-run shares the host's /tmp with every container)."""
    folder = Path(tempfile.mkdtemp(prefix="jobgen-container-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def build_image(image: Path, mount_points: list[Path]) -> Path:
    """An image directory with the folders and files ch-run binds onto (/dev, /proc, /sys, /tmp, a few
    files in /etc), a mount point for each bind, and a marker."""
    for name in ("dev", "proc", "sys", "tmp", "etc", "home", "opt/probe", "usr"):
        (image / name).mkdir(parents=True, exist_ok=True)
    # ch-run binds its own /etc/passwd and /etc/group, and the host's /etc/hosts and /etc/resolv.conf
    # (the node names of the cluster), onto these.
    for name in ("passwd", "group", "hosts", "resolv.conf"):
        (image / "etc" / name).touch()
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():  # a merged-/usr system: /bin -> usr/bin, found through the /usr bind
            (image / top).symlink_to(os.readlink(host))
        elif host.is_dir():
            mount_points.append(host)
    for point in mount_points:
        (image / point.relative_to("/")).mkdir(parents=True, exist_ok=True)
    (image / "IMAGE_MARKER").write_text(MARKER + "\n")
    return image


def probe(image: Path, python: str, hidden: list[Path]) -> None:
    """/opt/probe/python: records the container's view in $JOBGEN_RUN_DIR/probe.json, then runs python."""
    checks = " ".join(f'"$(test -e {h} && echo visible || echo hidden)"' for h in hidden)
    script = f"""#!/bin/sh
set -eu
{{
    printf '{{"marker": "%s", "ch_running": "%s", "hidden": [' "$(cat /IMAGE_MARKER)" "${{CH_RUNNING:-}}"
    first=1
    for seen in {checks}; do
        [ "$first" = 1 ] || printf ', '
        printf '"%s"' "$seen"
        first=0
    done
    printf ']}}\\n'
}} > "$JOBGEN_RUN_DIR/probe.json"
exec {python} "$@"
"""
    path = image / "opt" / "probe" / "python"
    path.write_text(script)
    path.chmod(0o755)


@pytest.mark.timeout(600)
def test_a_job_trains_inside_a_charliecloud_container(slurm, outside_tmp: Path):
    assert shutil.which("ch-run"), "ch-run is missing: apt-get install charliecloud-runtime (tests/cluster/up.sh)"
    root, hf_home = outside_tmp / "runs", outside_tmp / "hf"
    not_bound = outside_tmp / "not-bound"
    for folder in (root, hf_home, not_bound):
        folder.mkdir()
    (not_bound / "secret.txt").write_text("the host's, not the container's\n")
    # A checkout of jobgen's source, made here: the real one may live anywhere (under /tmp, which ch-run
    # shares, it is visible), and the job needs none (it runs the code snapshot in its run folder).
    checkout = not_bound / "checkout" / "jobgen" / "cli.py"
    checkout.parent.mkdir(parents=True)
    shutil.copyfile(REPO / "jobgen" / "cli.py", checkout)
    venv, install = Path(sys.prefix), Path(sys.base_prefix)
    binds = [Path("/usr"), install, venv]
    shared = [*binds, root, hf_home, Path("/tmp"), Path("/dev"), Path("/proc"), Path("/sys"), Path("/etc")]
    assert not [p for p in shared if not_bound.is_relative_to(p)], "the hidden files must lie where nothing is bound"
    image = build_image(outside_tmp / "image", [*binds, root, hf_home])
    # The task must not see what is not bound: a host folder beside the run root, and the checkout in it.
    probe(image, sys.executable, [not_bound / "secret.txt", checkout])
    mounts = ", ".join(f'"{p}"' for p in dict.fromkeys(str(b) for b in binds))
    body = (
        TINY_TRAIN.replace(f'python = "{sys.executable}"', 'python = "/opt/probe/python"')
        + f"""
[slurm]
cpus_per_task = 1
time = "00:10:00"

[launch]
launcher = "srun"

[container]
runtime = "charliecloud"
image = "{image}"
mounts = [{mounts}]
"""
    )
    exp = write_experiment(outside_tmp, "in_charliecloud", body)
    jobgen("validate", str(exp), root=root)
    jobgen("submit", str(exp), root=root, env={"HF_HOME": str(hf_home)})
    run_dir = only_run(root, "in_charliecloud")
    states = wait_states(run_dir, all_final, timeout=420, poll=3)
    (job,) = manifest(run_dir)["jobs"]
    job_dir = run_dir / job["dir"]
    logs = "".join(p.read_text() for p in sorted(job_dir.glob("slurm-*")))
    assert states[job["name"]] is State.COMPLETED, logs[-4000:]
    assert manifest(run_dir)["container"] == {"runtime": "charliecloud", "image": str(image)}
    script = (job_dir / "job.sbatch").read_text()
    assert "ch-run --cd=" in script and f"--bind={root}:{root}" in script, script
    # What the task saw: the image's root, not the host's ...
    seen = json.loads((run_dir / "probe.json").read_text())
    assert seen["marker"] == MARKER and seen["ch_running"], seen
    assert seen["hidden"] == ["hidden", "hidden"], seen
    assert not (Path("/") / "IMAGE_MARKER").exists()
    # ... and the training's result, written inside, lies in the run folder on the host through the bind.
    result = json.loads((job_dir / "result.json").read_text())
    assert result["world_size"] == 1 and result["epochs_done"] == 1 and result["test_acc"] is not None, result
    assert (hf_home).is_dir()
