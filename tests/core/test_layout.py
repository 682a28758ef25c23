"""The house rules that keep the next change small, checked on the source itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from jobgen import backends

REPO = Path(__file__).resolve().parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for elt in node.elts for c in _constants(elt)]
    return []


def test_no_module_outside_the_backends_compares_backend_names() -> None:
    names = set(backends.names())
    assert names == {"local", "sbatch", "submitit"}
    found = []
    for path in sorted((REPO / "jobgen").rglob("*.py")):
        if "backends" in path.relative_to(REPO / "jobgen").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    hits = names.intersection(_constants(side))
                    if hits:
                        found.append(f"{path.relative_to(REPO)}:{node.lineno} compares with {sorted(hits)}")
            # A table keyed by backend names is a comparison in disguise.
            keys = [c for k in node.keys if k for c in _constants(k)] if isinstance(node, ast.Dict) else []
            if len(names.intersection(keys)) >= 2:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} is a table keyed by backend name")
    assert not found, "ask the run's scheduler (jobgen.backends.get) instead:\n" + "\n".join(found)


def test_every_backend_module_defines_its_scheduler() -> None:
    for name in backends.names():
        scheduler = backends.get(name)
        assert scheduler.name == name
        assert (REPO / "jobgen" / "templates" / scheduler.template).is_file(), name
        assert scheduler.logs and scheduler.script_name, name


def _imports(path: Path, package: str) -> set[str]:
    """Modules of `package` that a module imports, anywhere in it: a function-level import is still one,
    and so is one under `if TYPE_CHECKING:` (an annotation that needs a module above is a seam in the
    wrong place)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
            for alias in node.names:  # from training import data; from jobgen.results import logs
                sub = f"{node.module}.{alias.name}"
                out.add(sub if _is_module(sub) else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == package}
    return out


def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph(package: str) -> dict[str, set[str]]:
    modules = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (REPO / package).rglob("*.py")
    }
    return {m: {i for i in _imports(p, package) if i in modules and i != m} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]], package: str) -> list[list[str]]:
    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return [*path, start]
                if nxt not in seen and nxt != package:  # the package's __init__ only documents it
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    return [c for m in sorted(graph) if m != package and (c := cycle_from(m))]


def test_the_training_package_has_no_import_cycle() -> None:
    graph = _graph("training")
    assert graph["training.data"] and "training.model" in graph["training.data"], "the scan sees imports"
    cycles = _cycles(graph, "training")
    assert not cycles, f"import cycles in training/: {cycles[0]}"


def test_the_jobgen_package_has_no_import_cycle() -> None:
    graph = _graph("jobgen")
    assert "jobgen.record.model" in graph["jobgen.results.state_rule"], "the scan sees imports"
    assert "jobgen.results.logs" in graph["jobgen.results.state_rule"], "the scan sees `from pkg import module`"
    cycles = _cycles(graph, "jobgen")
    assert not cycles, f"import cycles in jobgen/ (function-level imports included): {cycles[0]}"


# The stages, lowest first: a module may import its own stage and those below it, never one above. The
# flow of an experiment (experiment -> plan -> record -> results), with the backends right above the base:
# each backend is one object owning what differs by scheduler (its template, its shape rules, its
# commands), which the experiment's checks and the plan's rendering ask, while it needs none of them.
STAGES = ["base", "backends", "experiment", "plan", "record", "results", "commands", "cli"]
BASE = {"jobgen", "jobgen.errors", "jobgen.facts", "jobgen.states"}


def _stage(module: str) -> str:
    if module in BASE:
        return "base"
    part = module.split(".")[1]
    return part if part in STAGES else "cli"  # jobgen.cli, jobgen.completion


def test_each_stage_imports_only_stages_below_it() -> None:
    wrong = [
        f"{module} ({_stage(module)}) imports {other} ({_stage(other)})"
        for module, imported in sorted(_graph("jobgen").items())
        for other in sorted(imported)
        if STAGES.index(_stage(other)) > STAGES.index(_stage(module))
    ]
    assert not wrong, "a stage reaches up (types it needs go in jobgen/facts.py or jobgen/states.py):\n" + "\n".join(
        wrong
    )


SLURM_TOOLS = {"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "salloc", "sstat", "sprio"}


def test_only_the_backends_run_slurm_tools() -> None:
    """A command line (a list or tuple literal) that starts with a Slurm tool, outside jobgen/backends/."""
    found = []
    for path in sorted((REPO / "jobgen").rglob("*.py")):
        if "backends" in path.relative_to(REPO / "jobgen").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            for arg in node.args[:1]:
                if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts:
                    first = arg.elts[0]
                    if isinstance(first, ast.Constant) and first.value in SLURM_TOOLS:
                        found.append(f"{path.relative_to(REPO)}:{node.lineno} runs {first.value}")
            func = node.func
            runs_a_tool = isinstance(func, ast.Attribute) and func.attr in ("ask", "call", "run", "submit")
            if runs_a_tool and isinstance(func.value, ast.Name) and func.value.id == "slurm":
                found.append(f"{path.relative_to(REPO)}:{node.lineno} calls slurm.{func.attr}")
    assert not found, "ask the run's scheduler (jobgen.backends.get) instead:\n" + "\n".join(found)


def test_every_package_is_shipped() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for top in ("jobgen", "training")
        for p in (REPO / top).rglob("__init__.py")
    }
    assert on_disk <= listed, f"packages a wheel would leave out: {sorted(on_disk - listed)}"


def _one_letter_apart(a: str, b: str) -> bool:
    """Whether `b` is `a` with one letter changed, added or removed."""
    if len(a) > len(b):
        a, b = b, a
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    return len(b) - len(a) == 1 and any(b[:i] + b[i + 1 :] == a for i in range(len(b)))


def test_no_two_modules_are_named_a_letter_apart() -> None:
    """`states` beside `status` is read one for the other; a module's name says what it owns."""
    names = sorted({p.stem for p in (REPO / "jobgen").rglob("*.py") if p.stem != "__init__"})
    close = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if _one_letter_apart(a, b)]
    assert not close, close
    assert {"states", "status_view", "state_rule"} <= set(names)  # the three that once sat a letter apart
    assert _one_letter_apart("states", "status") and _one_letter_apart("plan", "plans")
