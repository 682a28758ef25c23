"""The [container] table's checks: what cannot work is refused at validation, one line naming the key.

    [container]
    runtime = "apptainer"            # apptainer, singularity, pyxis, charliecloud, or a partial of your own
    image = "/shared/images/torch.sif"
    mounts = ["/scratch/data", "/shared/hf:/hf"]
    env = ["WANDB_API_KEY"]

How a runtime wraps the launch is its template partial (jobgen/templates/_container_RUNTIME.j2, mapped
onto the launch by jobgen.plan.container); this module only says whether the table can work.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from jobgen import backends
from jobgen.experiment.schema import CONTAINER_RUNTIMES, Experiment
from training.contract import show

# The command each runtime needs on the machine that starts the tasks (pyxis is srun's own plugin).
BINARIES = {"apptainer": "apptainer", "singularity": "singularity", "charliecloud": "ch-run"}
# What partial a runtime is rendered with: Singularity is Apptainer's former name, with the same flags.
PARTIALS = {"singularity": "apptainer"}
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs", ".sif")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_PREFIXES = ("/", "./", "../", "~")


def partial_name(runtime: str) -> str:
    """The template partial of a runtime, e.g. _container_apptainer.j2."""
    return f"_container_{PARTIALS.get(runtime, runtime)}.j2"


def user_partial(exp: Experiment) -> Path | None:
    """The runtime's partial in the user's template folder (beside launch.template), if there is one."""
    if not exp.launch.template:
        return None
    path = (exp.base_dir / exp.launch.template).resolve().parent / partial_name(exp.container.runtime)
    return path if path.is_file() else None


def image_path(exp: Experiment) -> Path | None:
    """The local file or folder container.image names (absolute), or None for a registry name or URI."""
    runtime, image = exp.container.runtime, exp.container.image
    if not image or runtime not in CONTAINER_RUNTIMES:
        return None  # a site's own runtime gets its image as written
    if runtime == "pyxis" and not image.startswith(_PATH_PREFIXES):
        return None  # a registry name: nvcr.io#nvidia/pytorch:24.05-py3, ubuntu:22.04
    if runtime in ("apptainer", "singularity") and "://" in image:
        return None  # docker://, library://, oras://: pulled on the node
    return (exp.base_dir / Path(image).expanduser()).resolve()


def mount(item: str, base: Path) -> tuple[str, str]:
    """(source, destination) of one container.mounts item, 'SRC' or 'SRC:DST'; the source is made
    absolute (relative to the experiment file)."""
    src, _, dst = item.partition(":")
    source = str((base / Path(src).expanduser()).resolve())
    return source, dst or source


def problems(exp: Experiment) -> list[tuple[str, str]]:
    """(dotted key, problem) for what in [container] cannot work; empty when it can (or is unset)."""
    c = exp.container
    if not c.runtime:
        given = [k for k, v in (("image", c.image), ("mounts", c.mounts), ("env", c.env)) if v]
        if given:
            return [("container.runtime", f"container.{given[0]} is set but no runtime; {_choose}")]
        return []
    if c.runtime not in CONTAINER_RUNTIMES and user_partial(exp) is None:
        why = (
            f"{show(c.runtime)} is not one of {', '.join(CONTAINER_RUNTIMES)}; a runtime of your own "
            f"needs its partial {partial_name(c.runtime)} beside launch.template"
        )
        return [("container.runtime", why)]
    found = _image_problems(exp) + _mount_problems(exp)
    found += [
        (f"container.env[{i}]", f"{show(name)} is not an environment variable name; give one name per item")
        for i, name in enumerate(c.env)
        if not _ENV_NAME_RE.fullmatch(name)
    ]
    return found + _here_problems(exp)


_choose = f"set container.runtime to one of {', '.join(CONTAINER_RUNTIMES)}, or remove [container]"


def _image_problems(exp: Experiment) -> list[tuple[str, str]]:
    runtime, image = exp.container.runtime, exp.container.image
    if not image:
        return [("container.image", f"container.runtime = {show(runtime)} needs an image; set container.image")]
    if runtime == "pyxis" and not image.startswith(_PATH_PREFIXES) and image.endswith(SQUASHFS_SUFFIXES):
        # pyxis takes anything else for a registry name and tries to pull it (pyxis#127)
        why = (
            f"{show(image)}: pyxis reads a squashfs file only from a path starting with '/' or './' "
            f"(else it pulls a registry image of that name); write './{image}'"
        )
        return [("container.image", why)]
    path = image_path(exp)
    # Refused, not warned: as for data.files and train.model, the login node sees the shared file
    # system the nodes see, and a missing image would fail on every node after the queue wait.
    if path is not None and not path.exists():
        why = (
            f"{show(image)}: no such file or folder ({path}); give the path of an image that exists "
            "(relative paths are relative to the experiment file)"
        )
        return [("container.image", why)]
    return []


def _mount_problems(exp: Experiment) -> list[tuple[str, str]]:
    found = []
    for i, item in enumerate(exp.container.mounts):
        key = f"container.mounts[{i}]"
        src, _, dst = item.partition(":")
        if "," in item:
            found.append((key, f"{show(item)} has a ','; the runtimes split mount lists there: one path per item"))
        elif ":" in dst:
            found.append((key, f"{show(item)}: write 'SRC' or 'SRC:DST'; a path with ':' cannot be mounted"))
        elif not src or (dst and not dst.startswith("/")) or item.endswith(":"):
            found.append((key, f"{show(item)}: write 'SRC' or 'SRC:DST' with DST an absolute path"))
        elif not Path(mount(item, exp.base_dir)[0]).exists():
            found.append((key, f"{show(src)}: no such file or folder to mount (paths are relative to the file)"))
        else:
            found += [(key, p) for p in mount_point_problems(exp, [mount(item, exp.base_dir)[1]], "it")]
    return found


def mount_point_problems(exp: Experiment, destinations: list[str], what: str) -> list[str]:
    """ch-run binds only onto folders that exist in a read-only image (it shares the host's /tmp, where
    the host's folder is the mount point): one problem per destination without one in a directory image."""
    image = image_path(exp)
    if exp.container.runtime != "charliecloud" or image is None or not image.is_dir():
        return []
    found = []
    for dst in destinations:
        inside = image / dst.lstrip("/")
        if not (dst == "/tmp" or dst.startswith("/tmp/") or inside.exists()):
            found.append(
                f"{dst} ({what}) has no mount point in the image, and ch-run binds only onto folders the "
                f"image has: mkdir -p {inside}"
            )
    return found


def _here_problems(exp: Experiment) -> list[tuple[str, str]]:
    """A backend that runs the jobs on this machine needs the runtime here, and cannot use srun's pyxis."""
    runtime = exp.container.runtime
    if not backends.get(exp.launch.backend).runs_here:
        return []
    if runtime == "pyxis":
        why = (
            f"pyxis starts containers through srun, which launch.backend = {show(exp.launch.backend)} "
            "does not use; use launch.backend = 'sbatch' (or apptainer, charliecloud)"
        )
        return [("container.runtime", why)]
    binary = BINARIES.get(runtime)
    if binary and shutil.which(binary) is None:
        why = (
            f"{show(runtime)} needs {binary}, which is not on this machine's PATH, and "
            f"launch.backend = {show(exp.launch.backend)} runs the jobs here; install it or use sbatch"
        )
        return [("container.runtime", why)]
    return []
