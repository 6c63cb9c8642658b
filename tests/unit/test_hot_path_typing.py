"""Names imported only for mypy (under ``if TYPE_CHECKING:``, with ``TYPE_CHECKING = False``) must never be
needed at run time in the hot-path modules (every module that adopts the pattern: the hooks and the core
modules they import). Used outside an annotation they raise NameError in every hook run (a bare ``List``
setting in schema did: a traceback instead of a config error); ``ClassVar`` is worse: ``dataclasses`` only
recognises a string ``ClassVar[...]`` annotation when the name is in the module at run time, so a class
constant silently becomes a field (an ``__init__`` argument, a TOML key of a config section)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("autoheal", "hooks", "slurm_conf", "sbatch_helpers", "k8s_sync")


def _is_tc_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _bound(node: ast.AST) -> set:
    """The names an import, def, class or assignment binds."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def problems(source: str, where: str) -> list:
    """``where:line: ...`` for each run-time use of a TYPE_CHECKING-only name, and each ClassVar imported
    only for mypy."""
    tree = ast.parse(source)
    guarded: set = set()
    skip: set = set()  # nodes that never run: the TYPE_CHECKING bodies and the annotations
    out = []
    for node in ast.walk(tree):
        if _is_tc_block(node):
            for sub in node.body:
                for n in ast.walk(sub):
                    skip.add(id(n))
                    guarded |= _bound(n)
                    if isinstance(n, ast.ImportFrom) and any(a.name == "ClassVar" for a in n.names):
                        out.append(f"{where}:{n.lineno}: ClassVar imported only under TYPE_CHECKING "
                                   "(a ClassVar annotation then makes a dataclass field)")
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            anns.append(node.returns)
            anns += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x]
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        for ann in anns:
            if ann is not None:
                skip |= {id(n) for n in ast.walk(ann)}
    runtime = set()  # a name also bound at run time (an else branch, a no-op cast) is fine
    for node in ast.walk(tree):
        if id(node) not in skip:
            runtime |= _bound(node)
    for n in ast.walk(tree):
        if (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in guarded
                and id(n) not in skip and n.id not in runtime):
            out.append(f"{where}:{n.lineno}: {n.id} is imported only under TYPE_CHECKING but used at run time")
    return out


def _modules() -> list:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "TYPE_CHECKING = False" in text:
                found.append((str(path.relative_to(ROOT)), text))
    return found


def test_the_pattern_is_found_in_the_hot_path():
    names = {p for p, _ in _modules()}
    assert {"hooks/engine.py", "hooks/state.py", "hooks/checks.py", "autoheal/config/schema.py",
            "autoheal/records.py", "autoheal/config/snapshot.py"} <= names


def test_no_type_checking_only_name_is_used_at_run_time():
    found = [msg for path, text in _modules() for msg in problems(text, path)]
    assert found == []


BAD_ANY = """\
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List
def f(x: List[int]) -> Any:
    return x or Any
"""

BAD_CLASSVAR = """\
from __future__ import annotations
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar
class A:
    K: ClassVar[int] = 3
"""

FINE = """\
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, cast
else:
    def cast(_t, v):
        return v
def f(x: Any) -> Any:
    return cast("int", x)
"""


@pytest.mark.parametrize("source, expected", [
    (BAD_ANY, ["m.py:5: Any is imported only under TYPE_CHECKING but used at run time"]),
    (BAD_CLASSVAR, ["m.py:4: ClassVar imported only under TYPE_CHECKING (a ClassVar annotation then makes "
                    "a dataclass field)"]),
    (FINE, []),
])
def test_the_scan_finds_what_it_is_for(source, expected):
    assert problems(source, "m.py") == expected


def test_a_bare_list_or_dict_setting_validates():
    """A setting typed bare ``List``/``Dict`` (no item type) reaches schema's "any item" branch, which
    must name ``typing.Any`` (``Any`` itself is mypy's only there: it was a NameError in every hook)."""
    import dataclasses
    from typing import Dict, List

    from autoheal.config.schema import from_mapping, setting

    @dataclasses.dataclass
    class Section:
        xs: List = setting(default_factory=list, doc="any list")  # type: ignore[type-arg]
        table: Dict = setting(default_factory=dict, doc="any table")  # type: ignore[type-arg]

    got = from_mapping(Section, {"xs": [1, "a"], "table": {"k": 2}})
    assert got.xs == [1, "a"] and got.table == {"k": 2}
