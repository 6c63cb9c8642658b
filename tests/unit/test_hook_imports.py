"""What the three Slurm hooks import on a healthy node (issue 24 section 6): each runs on every node every
``HealthCheckInterval`` and around every job, and every module it imports is paid by every run.

Each hook runs whole, in a fresh interpreter, on a node with 8 healthy fake GPUs; ``-X importtime``
lists every module the process imported. The interpreter runs with ``-S`` and the source tree laid out
as installed (a folder of symlinks, ``setup.cfg``'s ``package_dir``), because the dev venv's editable
finders import ``pathlib`` and ``importlib.util`` at start-up and would hide those imports. The deny
list is what the hot path lost on purpose: a test fails when one of them comes back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: setup.cfg's package_dir: the four part folders are autoheal.<part> once installed.
PARTS = ("hooks", "slurm_conf", "sbatch_helpers", "k8s_sync")

#: Never on a healthy pass of any hook: heavy, or only needed by a pass that acts (Slurm, journal, notify).
DENY = frozenset({
    "kubernetes", "pynvml", "click", "requests", "urllib3",
    "typing",  # the hot path's annotations are for mypy only (TYPE_CHECKING = False)
    "pathlib", "urllib.parse", "ipaddress",  # os.path on the hot path; pathlib brings the other two
    "subprocess", "socket", "http.client", "hashlib", "tempfile", "difflib",
    "autoheal.journal", "autoheal.notify", "autoheal.slurm.base", "autoheal.slurm.cli", "autoheal.cliutil",
    "autoheal.job_records",  # the epilog imports it only when the job spool holds something
})
#: Not on a pass that found a valid config snapshot (autoheal.config.snapshot): no TOML is parsed.
DENY_WITH_SNAPSHOT = frozenset({"tomllib", "tomli", "string", "datetime"})

RUNNER = """\
import os, sys
import autoheal.config.snapshot as snapshot
snapshot.SNAPSHOT_DIR = sys.argv[1]
snapshot.TRUSTED_UID = os.geteuid()
del sys.argv[1:]
from autoheal.hooks.{hook} import main
main()
"""


@pytest.fixture(scope="module")
def installed_tree(tmp_path_factory) -> Path:
    """The source tree as setup.cfg installs it: ``autoheal/`` holding the core's files and the parts."""
    top = tmp_path_factory.mktemp("tree")
    pkg = top / "autoheal"
    pkg.mkdir()
    for entry in (ROOT / "autoheal").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for part in PARTS:
        (pkg / part).symlink_to(ROOT / part)
    return top


@pytest.fixture()
def node(tmp_path, lib_dir, installed_tree) -> dict:
    """A healthy lab node's hook environment (as bench/bench_hook_startup.py makes it)."""
    from autoheal_lab.fakenvml import state as gstate

    gstate.write_state(tmp_path / "n1.state", gstate.default_state("n1", 8))
    (tmp_path / "n1.kmsg").touch()
    (tmp_path / "spool").mkdir(mode=0o700)
    (tmp_path / "ah.toml").write_text(
        f'[journal]\npath = "{tmp_path}/journal.jsonl"\njob_spool = "{tmp_path}/spool"\n'
        f'[hooks]\nstate_dir = "{tmp_path}/state/{{node}}"\nkernel_log = "{tmp_path}/{{node}}.kmsg"\n'
        'expected_gpus = 8\ndcgm_mapping_dir = ""\n')
    import site

    path = [str(installed_tree)] + site.getsitepackages()  # site-packages for tomli on 3.9/3.10, no .pth
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(AUTOHEAL_CONFIG=str(tmp_path / "ah.toml"), LD_LIBRARY_PATH=str(lib_dir),
               AUTOHEAL_FAKE_NVML_STATE=str(tmp_path / "n1.state"), SLURMD_NODENAME="n1", SLURM_JOB_ID="1",
               SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_USER="test", SLURM_JOB_NODELIST="n1",
               PYTHONPATH=os.pathsep.join(path))
    return {"env": env, "cwd": tmp_path, "snapshots": tmp_path / "run"}


def imported(argv: list, node: dict) -> tuple:
    """(exit code, stdout, the set of modules the process imported) of ``python -S -X importtime argv``."""
    res = subprocess.run([sys.executable, "-S", "-X", "importtime", *argv], env=node["env"], cwd=node["cwd"],
                         capture_output=True, text=True, timeout=120)
    mods = {line.split("|")[2].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    return res.returncode, res.stdout, mods


def run_hook(hook: str, node: dict) -> tuple:
    return imported(["-c", RUNNER.format(hook=hook), str(node["snapshots"])], node)


@pytest.mark.parametrize("hook", ["healthcheck", "prolog", "epilog"])
def test_a_healthy_pass_imports_nothing_it_does_not_use(hook, node):
    _, _, interpreter = imported(["-c", "pass"], node)
    code, out, first = run_hook(hook, node)  # parses the TOML and leaves a snapshot
    assert code == 0, out
    assert any(node["snapshots"].iterdir()), "no config snapshot was written"
    code, out, again = run_hook(hook, node)  # uses the snapshot
    assert code == 0, out
    if hook == "healthcheck":
        assert out.strip() == "n1: ok"
    assert "autoheal.hooks.engine" in again and "autoheal.hooks.nvml" in again  # it did run the checks
    assert not sorted((first - interpreter) & (DENY - {"typing"})), "imported on the first pass (TOML parsed)"
    assert not sorted((again - interpreter) & (DENY | DENY_WITH_SNAPSHOT)), "imported with a valid snapshot"


def test_a_site_with_a_secrets_file_parses_no_toml_once_both_snapshots_are_there(node):
    """Sites that notify keep their webhook URLs in a root-only secrets file: its parse is kept too."""
    secrets = node["cwd"] / "secrets.toml"
    secrets.write_text('[notify]\nwebhooks = ["https://hooks.example/T0"]\n')
    os.chmod(secrets, 0o600)
    conf = node["cwd"] / "ah.toml"
    conf.write_text(conf.read_text() + f'[notify]\nsecrets_file = "{secrets}"\n')
    _, _, interpreter = imported(["-c", "pass"], node)
    assert run_hook("healthcheck", node)[0] == 0
    assert sorted(p.name.split("-")[0] for p in node["snapshots"].iterdir()) == ["config", "secrets"]
    code, out, again = run_hook("healthcheck", node)
    assert code == 0 and out.strip() == "n1: ok", out
    assert not sorted((again - interpreter) & (DENY | DENY_WITH_SNAPSHOT)), "imported with valid snapshots"


def test_the_guard_sees_a_denied_import(node):
    """The same check on a process that imports one of the denied modules finds it (the guard can fail)."""
    _, _, interpreter = imported(["-c", "pass"], node)
    _, _, mods = imported(["-c", "import autoheal.hooks.engine, pathlib, typing"], node)
    assert {"pathlib", "typing"} <= (mods - interpreter) & DENY
