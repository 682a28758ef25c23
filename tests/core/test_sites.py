"""Site profiles: site < experiment file < --set, which site is chosen, bad site files, what a run records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.backends import _tools
from jobgen.cli import main
from jobgen.commands.submit import load_experiment
from jobgen.experiment import sites
from jobgen.plan.plan import plan
from tests.support.stub_tools import install_stubs

EXPERIMENT = """
[experiment]
name = "exp"

[slurm]
time = "01:00:00"
{slurm}

[env]
{env}

[launch]
{launch}

[train]
engine = "lightning"
model = "distilbert-base-uncased"

[data]
dataset = "imdb"
"""

SITES = """
[sites.hpc1]
cluster_name = "c1"

[sites.hpc1.slurm]
account = "abc"
partition = "gpu"

[sites.hpc1.env]
modules = ["cuda/12.1"]

[sites.hpc2]
cluster_name = "c2"
slurm.partition = "a100"
"""

# A Slurm that names its cluster and notes every call; SCONTROL_CLUSTER picks the name.
SCONTROL = """
echo "$*" >> "$STATE/scontrol.calls"
[ "$1 $2" = "show config" ] || exit 1
echo "Configuration data as of 2026-12-01T10:00:00"
echo "AccountingStorageType   = accounting_storage/slurmdbd"
echo "ClusterName             = ${SCONTROL_CLUSTER:-c2}"
"""


def experiment(tmp_path: Path, slurm: str = "", env: str = "", launch: str = "") -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT.format(slurm=slurm, env=env, launch=launch))
    return path


@pytest.fixture
def sites_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SITES at the default place ($XDG_CONFIG_HOME/jobgen/sites.toml, tmp_path's by conftest)."""
    path = tmp_path / "xdg-config" / "jobgen" / "sites.toml"
    path.parent.mkdir(parents=True)
    path.write_text(SITES)
    return path


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stub scontrol; returns the file its calls are noted in."""
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL})
    return state / "scontrol.calls"


# (section, site's value, file's value, --set value): one key per section a site may set.
PRECEDENCE = [
    ("slurm", "partition", '"site-p"', '"file-p"', "set-p"),
    ("env", "conda", '"site_env"', '"file_env"', "set_env"),
    ("launch", "cache_dir", '"/site/cache"', '"/file/cache"', "/set/cache"),
]


@pytest.mark.parametrize(("section", "key", "site", "mine", "cli"), PRECEDENCE, ids=[p[0] for p in PRECEDENCE])
def test_site_then_file_then_set(tmp_path, monkeypatch, section, key, site, mine, cli):
    path = tmp_path / "sites.toml"
    path.write_text(f"[sites.s.{section}]\n{key} = {site}\n")
    monkeypatch.setenv("JOBGEN_SITES_FILE", str(path))

    def value(file_line: str, sets: list[str]) -> object:
        exp = load_experiment(experiment(tmp_path, **{section: file_line}), sets=sets, site="s")
        return getattr(getattr(exp, section), key)

    assert value("", []) == site.strip('"')
    assert value(f"{key} = {mine}", []) == mine.strip('"')
    assert value(f"{key} = {mine}", [f"{section}.{key}={cli}"]) == cli
    assert value("", [f"{section}.{key}={cli}"]) == cli


def test_what_the_site_gave_leaves_out_what_the_experiment_sets(tmp_path, sites_file):
    exp = load_experiment(experiment(tmp_path, slurm='partition = "mine"'), sets=["slurm.account=me"], site="hpc1")
    assert exp.slurm.partition == "mine" and exp.slurm.account == "me" and exp.env.modules == ["cuda/12.1"]
    assert exp.site is not None and exp.site.values == {"env.modules": ["cuda/12.1"]}


def test_a_sweep_varies_a_key_the_site_sets(tmp_path, sites_file):
    path = experiment(tmp_path)
    path.write_text(path.read_text() + '\n[sweep.grid]\n"slurm.partition" = ["p1", "p2"]\n')
    jobs = plan(load_experiment(path, site="hpc1"))
    assert [j.exp.slurm.partition for j in jobs] == ["p1", "p2"]
    assert all(j.exp.slurm.account == "abc" for j in jobs)


def test_the_command_line_backend_beats_the_site(tmp_path, sites_file):
    sites_file.write_text('[sites.hpc1.launch]\nbackend = "submitit"\n')
    assert load_experiment(experiment(tmp_path), backend="sbatch", site="hpc1").launch.backend == "sbatch"
    assert load_experiment(experiment(tmp_path), site="hpc1").launch.backend == "submitit"


def test_selection_order(tmp_path, monkeypatch, sites_file, scontrol):
    path = experiment(tmp_path)

    def chosen() -> str | None:
        site = load_experiment(path).site
        return site.name if site else None

    monkeypatch.setenv("JOBGEN_SITE", "hpc1")
    assert load_experiment(path, site="hpc2").site.name == "hpc2"  # --site beats JOBGEN_SITE
    assert chosen() == "hpc1"  # JOBGEN_SITE beats the cluster (c2 = hpc2)
    assert not scontrol.exists(), "a site was named: Slurm must not be asked"
    monkeypatch.delenv("JOBGEN_SITE")
    assert chosen() == "hpc2"  # ClusterName c2
    assert scontrol.read_text().splitlines() == ["show config"]  # once per load
    monkeypatch.setenv("SCONTROL_CLUSTER", "elsewhere")
    assert chosen() is None


@pytest.mark.parametrize("broken", ["exit 1", "sleep 0; echo 'no cluster name here'"], ids=["fails", "silent"])
def test_scontrol_failing_means_no_site(tmp_path, monkeypatch, sites_file, broken):
    install_stubs(tmp_path, monkeypatch, {"scontrol": broken})
    assert load_experiment(experiment(tmp_path)).site is None


def test_scontrol_missing_means_no_site(tmp_path, monkeypatch, sites_file):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert _tools.cluster_name() is None
    assert load_experiment(experiment(tmp_path)).site is None


def test_no_scontrol_without_a_sites_file_or_without_cluster_names(tmp_path, monkeypatch, runner, scontrol):
    path = experiment(tmp_path)
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "site" not in result.output and f"ok: {path}" in result.output
    scontrol.unlink(missing_ok=True)  # validate asks Slurm's limits (how many jobs fit); sites are asked below
    assert load_experiment(path).site is None
    assert not scontrol.exists(), "scontrol was asked without a sites file"
    no_names = tmp_path / "plain.toml"
    no_names.write_text('[sites.a.slurm]\naccount = "x"\n')
    monkeypatch.setenv("JOBGEN_SITES_FILE", str(no_names))
    assert load_experiment(path).site is None
    assert not scontrol.exists(), "scontrol was asked with no cluster_name to match"


def test_xdg_config_home_and_the_env_override(tmp_path, monkeypatch):
    assert sites.sites_file() == (tmp_path / "xdg-config" / "jobgen" / "sites.toml", False)
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sites.sites_file() == (tmp_path / "home" / ".config" / "jobgen" / "sites.toml", False)
    monkeypatch.setenv("JOBGEN_SITES_FILE", str(tmp_path / "s.toml"))
    assert sites.sites_file() == (tmp_path / "s.toml", True)


def test_a_sites_template_is_relative_to_the_sites_file(tmp_path):
    path = tmp_path / "conf" / "sites.toml"
    path.parent.mkdir()
    path.write_text('[sites.a.launch]\ntemplate = "site.sbatch.j2"\n')
    assert sites.load(path)["a"].tables["launch"]["template"] == str(path.parent / "site.sbatch.j2")


def test_dry_run_and_validate_name_the_site_values_and_the_manifest_records_them(tmp_path, runner, sites_file):
    path = experiment(tmp_path, slurm='partition = "mine"')
    line = f'site hpc1 ({sites_file}): slurm.account = "abc", env.modules = ["cuda/12.1"]'
    result = runner.invoke(main, ["validate", str(path), "--site", "hpc1"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == line
    root = tmp_path / "runs"
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), "--dry-run", "--site", "hpc1"])
    assert result.exit_code == 0, result.output
    assert line in result.output.splitlines()
    (manifest,) = root.glob("exp/*/manifest.json")
    doc = json.loads(manifest.read_text())
    assert doc["site"] == {
        "name": "hpc1",
        "file": str(sites_file),
        "values": {"slurm.account": "abc", "env.modules": ["cuda/12.1"]},
    }
    script = next(root.glob("exp/*/jobs/*/job.sbatch")).read_text()
    assert "#SBATCH --account=abc" in script and "#SBATCH --partition=mine" in script


def test_no_site_no_manifest_key(tmp_path, runner):
    root = tmp_path / "runs"
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(experiment(tmp_path)), "--dry-run"])
    assert result.exit_code == 0, result.output
    (manifest,) = root.glob("exp/*/manifest.json")
    assert "site" not in json.loads(manifest.read_text())


GOOD = '[sites.hpc1]\ncluster_name = "c1"\n[sites.hpc1.slurm]\naccount = "abc"\n'

# (id, sites file text, --site, experiment's [slurm] lines, words the one-line error must contain)
BAD = [
    ("toml-syntax", GOOD + "[sites.hpc1.env\n", "hpc1", "", ["sites.toml:5:", "TOML syntax error"]),
    ("unknown-key", GOOD + 'acount = "x"\n', "hpc1", "", ["sites.toml:5:", "sites.hpc1.slurm.acount", "'account'"]),
    ("wrong-type", GOOD + 'nodes = "two"\n', "hpc1", "", ["sites.hpc1.slurm.nodes", "expected int"]),
    ("below-min", GOOD + "nodes = 0\n", "hpc1", "", ["sites.hpc1.slurm.nodes", "got 0"]),
    ("bad-time", GOOD + 'time = "1 hour"\n', "hpc1", "", ["sites.hpc1.slurm.time", "not a Slurm time"]),
    ("bad-word", GOOD + 'qos = "a b"\n', "hpc1", "", ["sites.hpc1.slurm.qos", "characters"]),
    ("managed-extra", GOOD + 'extra = {partition = "x"}\n', "hpc1", "", ["sites.hpc1.slurm.extra", "slurm.partition"]),
    (
        "bad-choice",
        GOOD + '[sites.hpc1.launch]\nbackend = "pbs"\n',
        "hpc1",
        "",
        ["sites.hpc1.launch.backend", "sbatch"],
    ),
    ("bad-module", GOOD + '[sites.hpc1.env]\nmodules = ["a b"]\n', "hpc1", "", ["sites.hpc1.env.modules"]),
    ("newline", GOOD + 'gpu_type = "a\\nb"\n', "hpc1", "", ["sites.hpc1.slurm.gpu_type", "control character"]),
    ("sweep", GOOD + "[sites.hpc1.sweep]\ngrid = {}\n", "hpc1", "", ["sites.hpc1.sweep", "where jobs run"]),
    ("train", GOOD + "[sites.hpc1.train]\nepochs = 1\n", "hpc1", "", ["sites.hpc1.train", "not what they run"]),
    (
        "unknown-site-key",
        GOOD.replace("cluster_name", "clustername"),
        "hpc1",
        "",
        ["sites.hpc1.clustername", "'cluster_name'"],
    ),
    ("top-level-site", '[hpc1.slurm]\naccount = "x"\n', "hpc1", "", ["sites.toml:1:", "hpc1", "[sites.hpc1]"]),
    ("site-not-table", "[sites]\nhpc1 = 3\n", "hpc1", "", ["sites.hpc1", "must be a table"]),
    ("section-not-table", '[sites.hpc1]\nslurm = "gpu"\n', "hpc1", "", ["sites.hpc1.slurm", "must be a table"]),
    ("cluster-name-type", "[sites.hpc1]\ncluster_name = 3\n", "hpc1", "", ["sites.hpc1.cluster_name", "string"]),
    ("same-cluster", GOOD + '[sites.hpc2]\ncluster_name = "c1"\n', "hpc1", "", ["sites.hpc2.cluster_name", "hpc1"]),
    ("bad-site-name", '[sites."a b".slurm]\naccount = "x"\n', "hpc1", "", ["sites.a b", "letters, digits"]),
    ("unknown-site", GOOD, "hpc9", "", ["--site hpc9", "known sites: hpc1"]),
    ("secret", GOOD + '[sites.hpc1.env]\nvars = {HF_TOKEN = "x"}\n', "hpc1", "", ["sites.hpc1.env.vars.HF_TOKEN"]),
    ("clash-with-file", GOOD + "requeue = true\n", "hpc1", "chain = 2", ["slurm.chain", "site hpc1"]),
]


@pytest.mark.parametrize(("text", "site", "slurm", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_sites_file(tmp_path, runner, sites_file, text, site, slurm, words):
    sites_file.write_text(text)
    path = experiment(tmp_path, slurm=slurm)
    root = tmp_path / "runs"
    for argv in (
        ["validate", str(path), "--site", site],
        ["--output-root", str(root), "submit", str(path), "--dry-run", "--site", site],
    ):
        result = runner.invoke(main, argv)
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
        assert "Traceback" not in result.output
        assert str(sites_file) in lines[0]
        for word in words:
            assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    assert not root.exists() or not any(root.rglob("*")), "a failed submit left files behind"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"JOBGEN_SITE": "hpc1"}, ["JOBGEN_SITE hpc1", "no sites file", "sites.toml"]),
        ({"JOBGEN_SITES_FILE": "/nonexistent/sites.toml"}, ["JOBGEN_SITES_FILE=/nonexistent/sites.toml", "no such"]),
    ],
    ids=["named-site-no-file", "named-file-missing"],
)
def test_missing_sites_file(tmp_path, runner, monkeypatch, env, words):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(main, ["validate", str(experiment(tmp_path))])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert all(w in lines[0] for w in words), lines[0]


def test_site_option_on_every_command_that_loads_an_experiment(runner):
    for command in ("submit", "validate", "prefetch"):
        assert "--site NAME" in runner.invoke(main, [command, "--help"]).output


def test_jobgen_site_through_the_cli_and_no_site_with_resume(tmp_path, runner, monkeypatch, sites_file):
    monkeypatch.setenv("JOBGEN_SITE", "hpc2")
    result = runner.invoke(main, ["validate", str(experiment(tmp_path))])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == f'site hpc2 ({sites_file}): slurm.partition = "a100"'
    result = runner.invoke(main, ["submit", "--resume", str(tmp_path), "--site", "hpc1"])
    assert result.exit_code == 2 and "nor --site" in result.output
