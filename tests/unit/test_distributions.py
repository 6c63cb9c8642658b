"""The two distributions: slurm-autoheal (what sites install on every node) holds no lab, no C source
and no in-memory fakes; slurm-autoheal-lab holds the lab and adds ``autoheal lab`` through an entry point.

Both wheels are built (pip wheel --no-deps --no-build-isolation, a few seconds) from a clean copy of the
sources, so that a developer's old build/ or egg-info cannot change what is checked.
"""

from __future__ import annotations

import configparser
import email
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict

import click
import pytest
from click.testing import CliRunner

import autoheal
from autoheal.cli import lazy
from autoheal.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("autoheal", "hooks", "slurm_conf", "sbatch_helpers", "k8s_sync", "lab", "setup.cfg", "pyproject.toml",
           "README.md")
JUNK = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc", "*.so", "*.so.*")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Dict[str, zipfile.ZipFile]:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=JUNK)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheels")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(out), str(src), str(src / "lab")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    found = {}
    for whl in out.glob("*.whl"):
        dist = whl.name.split("-")[0]
        found[dist] = zipfile.ZipFile(whl)
    assert set(found) == {"slurm_autoheal", "slurm_autoheal_lab"}, sorted(found)
    return found


def _dist_info(whl: zipfile.ZipFile, name: str) -> str:
    [path] = [n for n in whl.namelist() if n.endswith(".dist-info/" + name)]
    return whl.read(path).decode()


def _entry_points(whl: zipfile.ZipFile) -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read_string(_dist_info(whl, "entry_points.txt"))
    return cfg


def test_product_wheel_has_no_lab_no_c_source_no_memory_fakes(wheels):
    whl = wheels["slurm_autoheal"]
    names = whl.namelist()
    assert [n for n in names if n.startswith("autoheal_lab/")] == []
    assert [n for n in names if n.endswith((".c", ".h"))] == []
    fakes = [n for n in names if n.endswith(".py")
             and any(cls in whl.read(n) for cls in (b"class MemorySlurm", b"class MemoryKube", b"class FakeKube"))]
    assert fakes == []
    assert "autoheal.commands" not in _entry_points(whl).sections()
    # what sites need is there: the core, the four parts, their data, the hooks' entry points
    for needed in ("autoheal/__init__.py", "autoheal/cli/main.py", "autoheal/hooks/healthcheck.py",
                   "autoheal/slurm_conf/cli.py", "autoheal/sbatch_helpers/runner.py", "autoheal/k8s_sync/daemon.py",
                   "autoheal/sbatch_helpers/examples/tiny_trainer.py"):
        assert needed in names
    assert {"autoheal", "autoheal-healthcheck", "autoheal-prolog", "autoheal-epilog"} <= set(
        _entry_points(whl)["console_scripts"])


def test_lab_wheel_has_the_lab_its_doubles_and_the_entry_point(wheels):
    whl = wheels["slurm_autoheal_lab"]
    names = whl.namelist()
    shipped = {n for n in names if not n.startswith("slurm_autoheal_lab-")}
    assert shipped and all(n.startswith("autoheal_lab/") for n in shipped), "the lab ships autoheal_lab only"
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "autoheal" / "lab").rglob("*")
              if p.is_file() and p.suffix in (".py", ".c")}
    assert source <= shipped, sorted(source - shipped)
    assert {"autoheal_lab/fakenvml/fake_nvml.c", "autoheal_lab/testing/slurm.py",
            "autoheal_lab/testing/kube.py"} <= shipped
    assert dict(_entry_points(whl)["autoheal.commands"]) == {"lab": "autoheal_lab.cli:lab"}
    meta = email.message_from_string(_dist_info(whl, "METADATA"))
    assert meta["Version"] == autoheal.__version__
    assert f"slurm-autoheal[k8s]=={autoheal.__version__}" in meta.get_all("Requires-Dist")


def test_the_wheels_share_no_file(wheels):
    product = set(wheels["slurm_autoheal"].namelist())
    lab = set(wheels["slurm_autoheal_lab"].namelist())
    assert product & lab == set()


# ---- the CLI's lookup of commands from other distributions --------------------------------------------

def test_lab_help_works_with_both_installed():
    from importlib import metadata

    try:
        metadata.distribution("slurm-autoheal-lab")
    except metadata.PackageNotFoundError:
        pytest.fail("slurm-autoheal-lab is not installed: ./dev setup installs both distributions")
    res = subprocess.run([str(Path(sys.executable).with_name("autoheal")), "lab", "--help"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert res.returncode == 0, res.stderr
    assert "autoheal lab [OPTIONS] COMMAND" in res.stdout and "drill" in res.stdout
    top = subprocess.run([str(Path(sys.executable).with_name("autoheal")), "--help"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert top.returncode == 0 and "  lab " in top.stdout


def test_lab_without_the_lab_distribution_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(lazy, "plugin_commands", lambda group=lazy.PLUGIN_GROUP: {})
    res = CliRunner().invoke(cli, ["lab", "up"])
    assert res.exit_code == 2
    assert "needs the slurm-autoheal-lab distribution" in res.output
    assert "pip install slurm-autoheal-lab" in res.output
    help_text = CliRunner().invoke(cli, ["--help"]).output
    assert "  lab " not in help_text  # not listed when not installed
    other = CliRunner().invoke(cli, ["nosuch"])
    assert other.exit_code == 2 and "No such command 'nosuch'" in other.output


@click.command()
def _hello() -> None:
    """Say hello."""
    click.echo("hello from a plugin")


def test_commands_of_other_distributions_load_through_the_entry_point(monkeypatch):
    monkeypatch.setattr(lazy, "plugin_commands",
                        lambda group=lazy.PLUGIN_GROUP: {"hello": f"{__name__}:_hello"})
    res = CliRunner().invoke(cli, ["hello"])
    assert res.exit_code == 0 and res.output == "hello from a plugin\n"
    assert re.search(r"^  hello +Say hello\.$", CliRunner().invoke(cli, ["--help"]).output, re.M)


def test_a_plugin_that_cannot_be_imported_is_named(monkeypatch):
    monkeypatch.setattr(lazy, "plugin_commands", lambda group=lazy.PLUGIN_GROUP: {"lab": "autoheal_no_such:lab"})
    res = CliRunner().invoke(cli, ["lab", "up"])
    assert res.exit_code == 1
    assert "cannot load autoheal_no_such:lab" in res.output


def test_built_in_commands_never_read_entry_points(monkeypatch):
    def scan(group=lazy.PLUGIN_GROUP):
        raise AssertionError("entry points scanned for a built-in command")

    monkeypatch.setattr(lazy, "plugin_commands", scan)
    for argv in (["events", "--help"], ["check", "--help"], ["config", "--help"]):
        res = CliRunner().invoke(cli, argv)
        assert res.exit_code == 0, (argv, res.output, res.exception)
