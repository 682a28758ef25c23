"""The house rules that keep the next change small, checked on the source itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from jobgen import backends

REPO = Path(__file__).resolve().parents[1]

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
    """Modules of `package` that a module imports, anywhere in it (a function-level import is still one)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
            if node.module == package:  # from training import data, model
                out |= {f"{package}.{alias.name}" for alias in node.names}
            else:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == package}
    return out


def test_the_training_package_has_no_import_cycle() -> None:
    root = REPO / "training"
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}  # fmt: skip
    graph = {m: {i for i in _imports(p, "training") if i in modules and i != m} for m, p in modules.items()}
    assert graph["training.data"] and "training.model" in graph["training.data"], "the scan sees imports"

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return [*path, start]
                if nxt not in seen and nxt != "training":  # the package's __init__ only documents it
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = [c for m in sorted(graph) if m != "training" and (c := cycle_from(m))]
    assert not cycles, f"import cycles in training/: {cycles[0]}"


def test_every_package_is_shipped() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for top in ("jobgen", "training")
               for p in (REPO / top).rglob("__init__.py")}  # fmt: skip
    assert on_disk <= listed, f"packages a wheel would leave out: {sorted(on_disk - listed)}"
