"""Packaging and layering facts that CI must keep true."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"autoheal": "autoheal", "autoheal.hooks": "hooks", "autoheal.slurm_conf": "slurm_conf",
          "autoheal.sbatch_helpers": "sbatch_helpers", "autoheal.k8s_sync": "k8s_sync"}


def _setup_cfg(path: str = "setup.cfg"):
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / path)
    return cfg


def _packages_under(pkg: str, base: Path):
    for init in base.rglob("__init__.py"):
        rel = init.parent.relative_to(base)
        yield pkg if str(rel) == "." else pkg + "." + ".".join(rel.parts)


def test_every_package_folder_is_listed_in_setup_cfg():
    listed = {p.strip() for p in _setup_cfg()["options"]["packages"].split() if p.strip()}
    found = set()
    for pkg, folder in MAPPED.items():
        for name in _packages_under(pkg, ROOT / folder):
            if name == "autoheal_lab" or name.startswith("autoheal_lab."):
                continue  # the lab's own distribution (lab/setup.cfg)
            found.add(name)
    assert found <= listed, f"add to setup.cfg [options] packages: {sorted(found - listed)}"
    assert not [p for p in listed if p.startswith("autoheal_lab")], "the lab is not part of the product"


def test_every_lab_package_is_listed_in_the_lab_setup_cfg():
    cfg = _setup_cfg("lab/setup.cfg")
    listed = {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}
    assert set(_packages_under("autoheal_lab", ROOT / "lab" / "autoheal_lab")) <= listed, \
        "add the package to lab/setup.cfg [options] packages"
    assert all(p.startswith("autoheal_lab") for p in listed), "the lab distribution ships autoheal_lab only"


def test_package_dir_maps_the_four_parts():
    raw = _setup_cfg()["options"]["package_dir"]
    pairs = dict(line.split("=") for line in raw.split("\n") if "=" in line)
    pairs = {k.strip(): v.strip() for k, v in pairs.items()}
    assert pairs == MAPPED


def test_cli_loads_subcommands_lazily():
    probe = ("import sys, json\nfrom autoheal.cli.main import cli\n"
             "print(json.dumps(sorted(m for m in sys.modules\n"
             "                        if m.startswith(('autoheal.', 'kubernetes', 'requests')))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    heavy = [m for m in loaded if m.startswith(("autoheal.hooks", "autoheal.k8s_sync", "autoheal.sbatch_helpers",
                                                "autoheal.slurm_conf", "autoheal_lab", "kubernetes", "requests"))]
    assert heavy == []
