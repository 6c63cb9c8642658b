"""No Slurm command is run outside the adapter (autoheal/slurm/): everything else asks the adapter's typed
methods, so a backend, a Slurm version or an output format changes in one place (issue 14).

The check reads the source tree (the core and the four parts; not tests/ and not lab/autoheal_lab, which
drives a real Slurm for the lab): a Slurm tool's name as an argv element (in a list or tuple) or as the
argument of a call that finds or runs a program is a Slurm command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# (srun is not here: the hot-spare shim runs the user's own job steps with it, inside the job)
TOOLS = {"scontrol", "sacct", "squeue", "sinfo", "scancel", "sbatch", "slurmctld", "slurmd", "sacctmgr", "sprio",
         "sshare", "sstat"}
#: scontrol verbs that give away an argv whose program is a variable (``[scontrol, "-d", "show", "job", id]``)
_SHOWN = {"job", "jobs", "node", "nodes", "config", "partition", "reservation"}
_VERBS = {"requeue", "requeuehold", "batch_script"}
RUNNERS = {"find_binary", "maybe_binary", "which", "run", "Popen", "check_output", "check_call", "call",
           "execvp", "execv", "execvpe"}
TREES = ["autoheal", "hooks", "slurm_conf", "sbatch_helpers", "k8s_sync"]
#: The declared exceptions, each with why.
ALLOWED = {
    # `autoheal sbatch` is a front-end to sbatch: it passes the user's own sbatch options through verbatim
    # and pipes the generated script on stdin (and prints that command for --dry-run). A typed adapter
    # method would have to take the same free-form argv; and the REST/pyslurm job-submit APIs take a
    # different job description, so a backend switch would silently change what users' options mean.
    ("sbatch_helpers/cli.py", "sbatch"),
}


def _python_files():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("autoheal/slurm/", "lab/autoheal_lab/")) or "/examples/" in rel:
                continue
            yield rel, path


def slurm_commands(source: str):
    """(line, tool) of every Slurm tool named as a command in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple)):
            elts = node.elts
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            elts = list(node.args) if name in RUNNERS else []
        else:
            continue
        words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in elts]
        for e, word in zip(elts, words):
            if word in TOOLS:
                found.append((e.lineno, word))
        if isinstance(node, ast.List) and (any(w in _VERBS for w in words) or any(
                a == "show" and b in _SHOWN for a, b in zip(words, words[1:]))):
            found.append((node.lineno, "scontrol"))
    return sorted(set(found))


def test_the_checker_sees_commands():
    assert slurm_commands('subprocess.run(["sacct", "-j", "1"])') == [(1, "sacct")]
    assert slurm_commands('x = find_binary("scontrol", d)') == [(1, "scontrol")]
    assert slurm_commands('for t, f in (("scontrol", "--version"), ("slurmd", "-V")): pass') == \
        [(1, "scontrol"), (1, "slurmd")]
    assert slurm_commands('subprocess.run([binary, "-d", "show", "job", job_id])') == [(1, "scontrol")]
    assert slurm_commands('click.command("sbatch")\nprint("scontrol is missing")\nx = ["show", "help"]') == []


def test_no_slurm_command_outside_the_adapter():
    offences = []
    for rel, path in _python_files():
        for line, tool in slurm_commands(path.read_text(encoding="utf-8")):
            if (rel, tool) not in ALLOWED:
                offences.append(f"{rel}:{line}: {tool}")
    assert offences == [], "Slurm commands outside autoheal/slurm/ (add a typed adapter method):\n" + \
        "\n".join(offences)


@pytest.mark.parametrize("rel,tool", sorted(ALLOWED))
def test_declared_exceptions_are_still_needed(rel, tool):
    assert any(t == tool for _, t in slurm_commands((ROOT / rel).read_text(encoding="utf-8")))
