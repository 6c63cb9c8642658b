"""No product function is longer than 60 lines (the devguide's rule; issue 24 split the last ones).

Read from the source with the AST, so a function that grows past the limit fails here with its name and
length, not in a review."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("autoheal", "hooks", "slurm_conf", "sbatch_helpers", "k8s_sync")
MAX_LINES = 60
#: Files excused for now (none: runner.py's Runner.run was split with hang detection, issue 23).
NOT_YET: set = set()


def functions(path: Path) -> Iterator[Tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function in ``path``, decorators excluded."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def walk(node: ast.AST, prefix: str) -> Iterator[Tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                yield name, child.lineno, (child.end_lineno or child.lineno) - child.lineno + 1
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def product_files() -> Iterator[Path]:
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() not in NOT_YET:
                yield path


def test_the_walk_finds_product_functions() -> None:
    names = {name for path in product_files() for name, _, _ in functions(path)}
    # the walk reaches methods and nested functions, and every part of the product
    assert {"health_pass", "Pass.to_dict", "_memory_tier.facts_of", "build_plan", "sbatch"} <= names


def test_no_product_function_is_over_60_lines() -> None:
    long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
            for path in product_files() for name, line, length in functions(path) if length > MAX_LINES]
    assert not long, "functions over 60 lines (split them into named steps):\n" + "\n".join(long)
