"""Golden scripts: every shipped experiment rendered with every concrete template.

Regenerate on purpose, after reading the diff:   .venv/bin/python -m tests.support.golden --update
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "tests" / "golden"
TEMPLATES = ("srun.sbatch.j2", "local.sh.j2", "setup.sh.j2", "array.sbatch.j2")
SEPARATOR = "\n# ---------------------------------------------------------------- next job\n"


# The container runtimes' partials, each with every launcher (the sbatch template; tests/data/containers).
CONTAINER_DIR = REPO / "tests" / "data" / "containers"
CONTAINER_CASES = [
    (CONTAINER_DIR / f"{runtime}.toml", [f"launch.launcher={launcher}"], f"container_{runtime}-{launcher}")
    for runtime in ("apptainer", "pyxis")
    for launcher in ("srun", "torchrun", "accelerate")
]


def cases() -> list[tuple[Path, str, list[str], Path]]:
    """(experiment, template, --set items, golden file) of every golden script."""
    shipped = [(e, t, [], golden_path(e, t)) for e in experiments() for t in TEMPLATES]
    return shipped + [
        (e, "srun.sbatch.j2", sets, GOLDEN_DIR / f"{name}__srun.golden") for e, sets, name in CONTAINER_CASES
    ]


def experiments() -> list[Path]:
    return sorted((REPO / "experiments").glob("*.toml"))


def golden_path(experiment: Path, template: str) -> Path:
    return GOLDEN_DIR / f"{experiment.stem}__{template.split('.')[0]}.golden"


def render_all(experiment: Path, template: str, sets: list[str] | None = None) -> str:
    """All jobs of an experiment in one text, with machine-specific paths replaced by placeholders."""
    from jobgen.commands.submit import load_experiment
    from jobgen.plan.plan import plan
    from jobgen.plan.render import RunInfo, render_job

    exp = load_experiment(experiment, sets=sets)
    run = RunInfo(run_id="RUNID", run_dir=Path("/RUNS") / exp.name / "RUNID", git_sha="GITSHA", version="VERSION")
    jobs = plan(exp)
    if template == "array.sbatch.j2":
        text = _render_arrays(exp, jobs, run)
    else:
        text = SEPARATOR.join(render_job(job, run, template=template) for job in jobs)
    return text.replace(str(REPO), "<REPO>")


def _render_arrays(exp, jobs, run) -> str:  # noqa: ANN001 - test helper
    """The experiment's sweep as job array script(s), as `launch.array = true` submits it; a sweep an
    array cannot hold gives the refusal instead."""
    from jobgen.errors import PlanError
    from jobgen.plan.arrays import DEFAULT_MAX_ARRAY_SIZE, render_arrays

    scripts = [f"jobs/{job.name}/job.sbatch" for job in jobs]
    try:
        arrays = render_arrays(jobs, scripts, run, exp.path, exp.launch.array_parallelism, DEFAULT_MAX_ARRAY_SIZE)
    except PlanError as exc:
        return f"# launch.array refused: {exc}\n"
    return SEPARATOR.join(array["text"] for array in arrays)


def main(argv: list[str]) -> int:
    if argv != ["--update"]:
        print(__doc__)
        return 2
    GOLDEN_DIR.mkdir(exist_ok=True)
    for experiment, template, sets, path in cases():
        path.write_text(render_all(experiment, template, sets), encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
