"""Golden scripts: every shipped experiment rendered with every concrete template.

Regenerate on purpose, after reading the diff:   .venv/bin/python -m tests.golden --update
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO / "tests" / "golden"
TEMPLATES = ("srun.sbatch.j2", "local.sh.j2", "setup.sh.j2")
SEPARATOR = "\n# ---------------------------------------------------------------- next job\n"


def experiments() -> list[Path]:
    return sorted((REPO / "experiments").glob("*.toml"))


def golden_path(experiment: Path, template: str) -> Path:
    return GOLDEN_DIR / f"{experiment.stem}__{template.split('.')[0]}.golden"


def render_all(experiment: Path, template: str) -> str:
    """All jobs of an experiment in one text, with machine-specific paths replaced by placeholders."""
    from jobgen.plan import plan
    from jobgen.render import RunInfo, render_job
    from jobgen.submit import load_experiment

    exp = load_experiment(experiment)
    run = RunInfo(run_id="RUNID", run_dir=Path("/RUNS") / exp.name / "RUNID", git_sha="GITSHA", version="VERSION")
    text = SEPARATOR.join(render_job(job, run, template=template) for job in plan(exp))
    return text.replace(str(REPO), "<REPO>")


def main(argv: list[str]) -> int:
    if argv != ["--update"]:
        print(__doc__)
        return 2
    GOLDEN_DIR.mkdir(exist_ok=True)
    for experiment in experiments():
        for template in TEMPLATES:
            path = golden_path(experiment, template)
            path.write_text(render_all(experiment, template), encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
