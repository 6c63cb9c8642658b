"""The order `./dev test` hands the test files to its workers (tests/conftest.py): longest first."""

from __future__ import annotations

from pathlib import Path

from conftest import LONGEST_FIRST, run_order

TESTS = Path(__file__).resolve().parents[1]


def test_every_file_named_longest_first_exists():
    """A renamed or removed file left in the list would only lose its place silently."""
    missing = [name for name in LONGEST_FIRST
               if not ((TESTS / "integration" / name).is_file() or (TESTS / "unit" / name).is_file())]
    assert not missing, missing
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_long_files_come_first_then_the_lab_files_then_the_unit_tests():
    assert "test_lab.py" not in LONGEST_FIRST and "test_guard.py" not in LONGEST_FIRST
    ids = ["tests/unit/test_guard.py::test_a", "tests/integration/test_lab.py::test_b",
           f"tests/integration/{LONGEST_FIRST[1]}::test_c", f"tests/integration/{LONGEST_FIRST[0]}::test_d[x]",
           "tests/unit/test_adapter.py::test_e"]
    assert sorted(ids, key=run_order) == [ids[3], ids[2], ids[1], ids[0], ids[4]]
