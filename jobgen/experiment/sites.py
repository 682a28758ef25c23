"""Site profiles: one file of named sites, each giving defaults for [slurm], [env], [container], [launch].

    # ~/.config/jobgen/sites.toml ($XDG_CONFIG_HOME/jobgen/sites.toml; or the file $JOBGEN_SITES_FILE names)
    [sites.hpc1]
    cluster_name = "hpc1"        # optional: chosen when `scontrol show config` says ClusterName = hpc1
    [sites.hpc1.slurm]
    account = "abc"
    partition = "gpu"

Which site: --site NAME, else $JOBGEN_SITE, else the one whose cluster_name is this cluster's, else none.
Precedence: site < experiment file < --set (and the command's own options); a sweep varies a key over
all three. A key's value is replaced whole: a file's env.vars replaces the site's env.vars.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.errors import ConfigError
from jobgen.experiment import config, schema
from jobgen.experiment.resolved import toml_value
from jobgen.experiment.schema import SiteDefaults as SiteDefaults
from training.contract import show, suggest

# A site says where jobs run, not what they run: no [experiment], [train], [data] or [sweep].
SECTIONS = ("slurm", "env", "container", "launch")
KEYS = ("cluster_name", *SECTIONS)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Site:
    """One [sites.NAME] table, validated."""

    name: str
    file: Path
    cluster_name: str
    tables: dict[str, dict[str, Any]]


def describe(record: dict[str, Any]) -> str:
    """One line: `site hpc1 (/path/sites.toml): slurm.account = "abc", slurm.partition = "gpu"`."""
    values = ", ".join(f"{k} = {toml_value(v)}" for k, v in record["values"].items())
    return f"site {record['name']} ({record['file']}): {values or 'no values used (the experiment sets them all)'}"


def sites_file() -> tuple[Path, bool]:
    """The sites file and whether the user named it ($JOBGEN_SITES_FILE): a named file must exist."""
    named = os.environ.get("JOBGEN_SITES_FILE")
    if named:
        return Path(named).expanduser().absolute(), True
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return (Path(base) / "jobgen" / "sites.toml").absolute(), False


def choose(name: str | None = None) -> Site | None:
    """The site to use: `name` (--site), else $JOBGEN_SITE, else the one matching this cluster, else none.
    Slurm is asked only when no site is named and some site has a cluster_name."""
    source = "--site" if name else "JOBGEN_SITE"
    name = name or os.environ.get("JOBGEN_SITE") or None
    path, named = sites_file()
    if not path.is_file():
        if named:
            raise ConfigError(f"JOBGEN_SITES_FILE={path}: no such file; point it at your sites file, or unset it")
        if name:
            raise ConfigError(
                f"{source} {name}: there is no sites file ({path}); write one (see docs/guides/sites.md) "
                "or point JOBGEN_SITES_FILE at it"
            )
        return None
    sites = load(path)
    if name:
        if name not in sites:
            known = ", ".join(sites) or "none"
            raise ConfigError(f"{source} {name}: no such site in {path}{suggest(name, sites)}; known sites: {known}")
        return sites[name]
    by_cluster = {s.cluster_name: s for s in sites.values() if s.cluster_name}
    if not by_cluster:
        return None
    from jobgen.backends._tools import cluster_name

    cluster = cluster_name()
    return by_cluster.get(cluster) if cluster else None


def load(path: Path) -> dict[str, Site]:
    """Read and check every site of a sites file; errors name the file, line and `sites.NAME.key`."""
    text, raw = config.read_toml(path, "the sites file", " in the sites file")

    def fail(dotted: str, problem: str) -> ConfigError:
        line = config.locate(text, dotted) or _header_line(text, dotted)
        return ConfigError(f"{path}:{line}: {dotted}: {problem}" if line else f"{path}: {dotted}: {problem}")

    for key in raw:
        if key != "sites":
            raise fail(key, f"not a site table; write each site as [sites.NAME], e.g. [sites.{key}]")
    tree = raw.get("sites", {})
    if not isinstance(tree, dict):
        raise fail("sites", "must be a table of sites, [sites.NAME]")
    sites = {name: _site(name, value, path, text, fail) for name, value in tree.items()}
    clusters: dict[str, str] = {}
    for site in sites.values():
        if site.cluster_name in clusters:
            other = clusters[site.cluster_name]
            raise fail(
                f"sites.{site.name}.cluster_name",
                f"{site.cluster_name!r} is also site {other}'s cluster_name; give each cluster one site",
            )
        if site.cluster_name:
            clusters[site.cluster_name] = site.name
    return sites


def _header_line(text: str, dotted: str) -> int | None:
    """The first table header inside the key: [hpc1.slurm] for `hpc1`, which has no header of its own."""
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]", line.strip())
        if header and f"{header.group(1)}.".startswith(f"{dotted}."):
            return number
    return None


def _site(name: str, value: Any, path: Path, text: str, fail: Callable[[str, str], ConfigError]) -> Site:
    prefix = f"sites.{name}"
    if not _NAME_RE.fullmatch(name):
        raise fail(prefix, "a site name uses letters, digits, '_', '.' and '-', starting with a letter or digit")
    if not isinstance(value, dict):
        raise fail(prefix, f"must be a table ([{prefix}]), got {show(value)}")
    for key in value:
        if key not in KEYS:
            what = "a site sets where jobs run, not what they run" if key in schema.SECTIONS else "unknown key"
            raise fail(
                f"{prefix}.{key}",
                f"{what}{suggest(key, KEYS)}; a site has cluster_name and the tables {', '.join(SECTIONS)}",
            )
    cluster = value.get("cluster_name", "")
    if not isinstance(cluster, str):
        raise fail(f"{prefix}.cluster_name", f"expected a string, got {show(cluster)}")
    tables = {k: v for k, v in value.items() if k != "cluster_name"}
    for section, table in tables.items():
        if not isinstance(table, dict):
            raise fail(f"{prefix}.{section}", f"must be a table ([{prefix}.{section}]), got {show(table)}")
    config.check_tables(tables, display=str(path), text=text, prefix=prefix + ".")
    template = tables.get("launch", {}).get("template")
    if template:  # a site's template lives next to the sites file, not next to each experiment
        tables["launch"] = {**tables["launch"], "template": str(path.parent / Path(template).expanduser())}
    box = tables.get("container", {})
    if box.get("image", "").startswith(("./", "../")):  # so does an image it names by a relative path
        tables["container"] = {**box, "image": str(path.parent / box["image"])}
    return Site(name=name, file=path, cluster_name=cluster, tables=tables)


def apply(exp: config.Experiment, site: Site | None) -> config.Experiment:
    """The experiment with the site's values under its own (and its --set items'), validated again."""
    if site is None:
        return exp
    raw = dict(exp.raw)
    given: dict[str, Any] = {}
    for section, table in site.tables.items():
        own = exp.raw.get(section, {})
        given.update({f"{section}.{k}": v for k, v in table.items() if k not in own})
        raw[section] = {**table, **own}
    try:
        built = config.build(raw, path=exp.path, text=exp.text, display=exp.label)
    except ConfigError as exc:
        raise _blame(exc.message, exp.label, site, given) from None
    return dataclasses.replace(built, site=SiteDefaults(name=site.name, file=site.file, values=given))


def _blame(message: str, label: str, site: Site, given: dict[str, Any]) -> ConfigError:
    """A check of the whole experiment failed: name the site's key when the key it names came from the site."""
    lead = f"{label}: "
    for key in given:
        if message.startswith(lead + key) and message[len(lead + key) :][:1] in (":", "."):
            return ConfigError(f"{site.file}: sites.{site.name}.{message[len(lead) :]} (a default for {label})")
    return ConfigError(f"{message} (with the defaults of site {site.name}, {site.file})")
