"""The framework recipes in sbatch_helpers/examples stay loadable without their frameworks (CI has no
torch): Python files compile and answer --help, sbatch scripts ask for the signal the recipe promises."""

from __future__ import annotations

import py_compile
import re
import subprocess
import sys
from pathlib import Path

import pytest

import autoheal.sbatch_helpers as sbh
from autoheal.slurm.model import WarnSignal
from autoheal.slurm.parse import requested_signal

EXAMPLES = Path(sbh.__file__).parent / "examples"


@pytest.mark.parametrize("name", ["submitit_job.py", "lightning_job.py"])
def test_python_recipes_compile(name):
    py_compile.compile(str(EXAMPLES / name), doraise=True)


def test_lightning_recipe_help_needs_no_torch():
    res = subprocess.run([sys.executable, str(EXAMPLES / "lightning_job.py"), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "--root" in res.stdout, res.stderr


def test_lightning_script_asks_for_usr2_on_its_steps_matching_its_requeue_signal():
    script = (EXAMPLES / "lightning_job.sbatch").read_text()
    assert requested_signal(script=script) == WarnSignal("USR2", 120, False)
    assert "requeue_signal=signal.SIGUSR2" in (EXAMPLES / "lightning_job.py").read_text()
    assert re.search(r"(?m)^#SBATCH .*--requeue", script) and "--open-mode=append" in script


def test_torchrun_script_keeps_torchrun_alive_on_the_runners_signal():
    script = (EXAMPLES / "torchrun_job.sbatch").read_text()
    assert requested_signal(script=script) is None  # the runner adds B:USR2@grace itself
    assert "trap \"\" USR2; exec torchrun" in script
    assert (EXAMPLES / "ddp_trainer.py").exists()


_NO_LAB = ("import sys, runpy\n"
           "sys.modules['autoheal_lab'] = None  # a real cluster: importing the lab fails\n"
           "sys.argv = [sys.argv[1], '--help']\n"
           "try:\n"
           "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
           "except SystemExit as exc:\n"
           "    assert exc.code == 0, exc.code\n"
           "assert sys.modules['autoheal_lab'] is None\n")


@pytest.mark.parametrize("name", ["ddp_trainer.py", "lightning_job.py", "submitit_job.py", "tiny_trainer.py"])
def test_the_recipes_run_where_the_lab_is_not_importable(name):
    """The lab's device hook is opt-in (``--device lab``): a recipe never imports the lab otherwise."""
    res = subprocess.run([sys.executable, "-c", _NO_LAB, str(EXAMPLES / name)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--device {none,lab}" in res.stdout


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name.replace(".py", ""), EXAMPLES / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lightning_default_device_makes_no_gpu_call_and_imports_nothing_of_the_lab(monkeypatch):
    monkeypatch.setitem(sys.modules, "autoheal_lab", None)
    dev = _load("lightning_job.py").open_device("none")
    dev.step()
    dev.copy_to_host()
