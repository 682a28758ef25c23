"""The wheels the GPU check brings to a machine without internet (docs/gpu-check.md).

    python bench/gpu_check_wheels.py prepare .whl [--have FREEZE.txt]   # where PyPI can be reached
    python bench/gpu_check_wheels.py install .whl /tmp/site-packages     # on the GPU machine

`prepare` runs with the project's environment (bootstrap's .venv): what the check imports there
(datasets, deepspeed, click and everything they require, the exact versions installed) less what the
GPU machine's image has already. That image is given as its `pip freeze` (--have), or assumed to be a
typical CUDA training image: torch, transformers, lightning, accelerate, peft, torchmetrics and what
they require. Binary wheels for the target's Python and Linux are downloaded with pip; DeepSpeed,
published as source only, is built into a pure-Python wheel (its CUDA ops build at run time, when
asked). pyarrow and pandas are slimmed (tests, headers, Cython sources, and pyarrow's optional Flight
and S3 components, which pyarrow imports only when asked for them): without that the wheels alone
would be over the 60 MiB a check may bring. It prints each wheel's size and the total.

`install` installs (pip --no-deps --target) each wheel whose distribution the machine lacks, or has
in another version, and prints what it installed; the caller puts the target first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata as md
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NEEDS = ("datasets", "deepspeed", "click")  # what the check imports beyond a typical image (training/, jobgen's cost)
TYPICAL_IMAGE = ("torch", "transformers", "lightning", "accelerate", "peft", "torchmetrics")
BUDGET_MIB = 60.0  # everything the check brings, the repository included
# Members left out of a slimmed wheel: what no import of the check reaches.
SLIM = {
    "pyarrow": re.compile(
        r"pyarrow/(include|tests|src)/|\.(pyx|pxd|pxi|h|cc)$|flight|_s3fs|libarrow_s3|libarrow_python\.so(\.\d+\.\d+\.\d+)?$"
    ),
    "pandas": re.compile(r"pandas/tests/|\.(pyx|pxd|pxi|h|c)$"),
}


def name_of(wheel: Path) -> tuple[str, str]:
    """(canonical distribution name, version) from a wheel's file name."""
    dist, version = wheel.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", dist).lower(), version


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str] | tuple[str, ...]) -> dict[str, str]:
    """name -> installed version of the roots and everything they require (this environment's metadata)."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonical(todo.pop())
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def have_from_freeze(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(==|@| )", line)
        if match:
            names.add(canonical(match.group(1)))
    return names


def slim(wheel: Path, drop: re.Pattern[str]) -> None:
    """Rewrite `wheel` without the members `drop` matches (RECORD rewritten to match)."""
    tmp = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in src.infolist():
            if info.filename == record_name or drop.search(info.filename):
                continue
            data = src.read(info.filename)
            out.writestr(info, data, zipfile.ZIP_DEFLATED, 9)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        out.writestr(record_name, "\n".join([*rows, f"{record_name},,"]) + "\n")
    tmp.replace(wheel)


def prepare(folder: Path, have_file: Path | None, python: str, pip: list[str]) -> int:
    needed = closure(NEEDS)
    have = have_from_freeze(have_file) if have_file else set(closure(TYPICAL_IMAGE))
    missing = {name: version for name, version in needed.items() if name not in have}
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    print(f"the check needs {', '.join(NEEDS)}; the image lacks: {', '.join(sorted(missing)) or 'nothing'}")
    binary = [f"{n}=={v}" for n, v in sorted(missing.items()) if n != "deepspeed"]
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    if binary:
        flags = [f"--platform={p}" for p in platforms] + ["--python-version", python, "--only-binary=:all:"]
        subprocess.run([*pip, "download", "-q", "--no-deps", "-d", str(folder), *flags, *binary], check=True)
    if "deepspeed" in missing:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [
                    *pip,
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary=:all:",
                    "-d",
                    tmp,
                    f"deepspeed=={missing['deepspeed']}",
                ],
                check=True,
            )
            (sdist,) = Path(tmp).glob("deepspeed-*")
            # Built with this environment's torch (DeepSpeed's setup.py imports it); DS_BUILD_OPS unset: no ops.
            env = {**os.environ, "PYTHONPATH": ":".join(p for p in sys.path if p)}
            subprocess.run(
                [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(folder), str(sdist)],
                check=True,
                env=env,
            )
    total = 0
    for wheel in sorted(folder.glob("*.whl")):
        name, _ = name_of(wheel)
        before = wheel.stat().st_size
        if name in SLIM:
            slim(wheel, SLIM[name])
        size = wheel.stat().st_size
        total += size
        note = f" (slimmed from {before / 2**20:.1f})" if size != before else ""
        print(f"  {size / 2**20:6.2f} MiB  {wheel.name}{note}")
    print(f"wheels: {total / 2**20:.1f} MiB in {folder} (with the repository, at most {BUDGET_MIB:.0f} MiB)")
    return 0


def install(folder: Path, target: Path) -> int:
    """pip --no-deps --target each wheel whose distribution is missing here, or here in another version."""
    wanted = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version = name_of(wheel)
        try:
            present = md.version(name)
        except md.PackageNotFoundError:
            present = None
        if present != version:
            wanted.append(wheel)
            print(f"installing {name} {version}" + (f" (the image has {present})" if present else ""), flush=True)
    if wanted:
        target.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run(
            [*command, "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wanted)], check=True
        )
    print(f"wheels: {len(wanted)} installed into {target}, {len(list(folder.glob('*.whl'))) - len(wanted)} present")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="download (and slim) the wheels the GPU machine lacks")
    prep.add_argument("folder", type=Path)
    prep.add_argument("--have", type=Path, help="`pip freeze` of the GPU machine's image (default: a typical one)")
    prep.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    prep.add_argument("--pip", default="python3 -m pip", help="the pip to download and build with")
    inst = sub.add_parser("install", help="install the wheels this machine lacks")
    inst.add_argument("folder", type=Path)
    inst.add_argument("target", type=Path)
    args = parser.parse_args()
    if args.command == "prepare":
        return prepare(args.folder, args.have, args.python, args.pip.split())
    return install(args.folder, args.target)


if __name__ == "__main__":
    raise SystemExit(main())
