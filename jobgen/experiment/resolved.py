"""The resolved experiment a run records: its experiment file with the site's values and the `--set`
items (and the command line's launch choices) applied, as TOML (experiment.resolved.toml).

It is what the run's jobs were planned from, so `jobgen diff` compares it: two runs that differ by one
`--set` item differ by that key here, where their experiment.toml files are the same. Only the keys
someone set are in it; a key left to its default is absent (jobgen schema gives the defaults).
"""

from __future__ import annotations

import datetime
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.experiment import config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FILE = "experiment.resolved.toml"
HEADER = (
    "# What this run's jobs were planned from: experiment.toml with the site's values and the --set items\n"
    "# applied (written by jobgen; docs/contracts.md). A key left to its default is not here.\n"
)


def text(tree: Mapping[str, Any]) -> str:
    """The file's text: the header, then the tree as TOML (tomllib reads back the same tree)."""
    return HEADER + "\n" + dumps(tree)


def read(run_dir: Path, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the run's resolved experiment, whether the run recorded it). A run recorded before runs kept it
    gets it rebuilt from its experiment.toml and its manifest's `overrides` and `site` values (False).
    JobgenError naming the file when neither can be read."""
    tree = _toml(run_dir / FILE)
    if tree is not None:
        return tree, True
    tree = _toml(run_dir / "experiment.toml")
    if tree is None:
        raise JobgenError(f"{run_dir / 'experiment.toml'}: missing")
    try:
        return rebuilt(tree, manifest, str(run_dir / "experiment.toml")), False
    except JobgenError as exc:
        raise JobgenError(f"{run_dir / 'manifest.json'}: its overrides cannot be applied ({exc.message})") from None


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys: {"train": {"epochs": 1}} -> {"train.epochs": 1}."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def set_apart_from_defaults(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A flattened experiment less the keys set to their default: a key at its default plans what
    leaving it out plans (diff and the summary's configurations compare what is left)."""
    from jobgen.experiment.schema import defaults

    known, missing = defaults(), object()
    return {key: value for key, value in flat.items() if known.get(key, missing) != value}


def _toml(path: Path) -> dict[str, Any] | None:
    """A TOML file's tree; None when it is missing, JobgenError naming it when it cannot be read."""
    try:
        tree: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise JobgenError(f"{path}: unreadable or not TOML ({exc})") from None
    return tree


def rebuilt(tree: dict[str, Any], manifest: Mapping[str, Any], label: str) -> dict[str, Any]:
    """A parsed experiment file with the manifest's `--set` items (`overrides`), then the values its
    site gave (`site.values`, only keys neither set), applied: site < file < --set, as at submit."""
    overrides = manifest.get("overrides")
    out = config.set_items(tree, [str(item) for item in overrides] if isinstance(overrides, list) else [], label)
    site = manifest.get("site")
    values = site.get("values") if isinstance(site, Mapping) else None
    for dotted, value in values.items() if isinstance(values, Mapping) else ():
        section, _, key = str(dotted).partition(".")
        table = out.setdefault(section, {})
        if isinstance(table, dict) and key:
            table.setdefault(key, value)
    return out


# --- TOML -------------------------------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def dumps(tree: Mapping[str, Any]) -> str:
    """A tree of TOML values (what tomllib gives) as TOML text: tables under [headers], other values
    inline. tomllib.loads of the text gives the tree back."""
    out: list[str] = []
    _table(out, [], tree)
    return "\n".join(out) + "\n"


def _table(out: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    plain = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    nested = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    # A table with only tables inside is made by their headers; an empty one needs its own.
    if path and (plain or not nested):
        if out:
            out.append("")
        out.append("[" + ".".join(_key(p) for p in path) + "]")
    out += [f"{_key(k)} = {toml_value(v)}" for k, v in plain]
    for key, value in nested:
        _table(out, [*path, key], value)


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else _string(key)


def toml_value(value: Any) -> str:
    """One TOML value (what tomllib gives) as TOML text, inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return _string(str(value))


def _string(text: str) -> str:
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if _control(c) else c) for c in text) + '"'


def _control(char: str) -> bool:
    return ord(char) < 0x20 or ord(char) == 0x7F
